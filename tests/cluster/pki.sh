# Client certificates signed by the test CA (sourced by up.sh and tests/setup/node.sh).

# issue_client_cert <pki-dir> <file-stem> <CN> [O]: writes <stem>.crt/.key in
# <pki-dir>, signed by its ca.crt/ca.key, unless both already exist. The CN is
# the Kubernetes user name and O its group. Idempotent.
issue_client_cert() {
  local pki="$1" stem="$2" cn="$3" org="${4:-}" tmp subj="/CN=$3"
  [ -f "$pki/$stem.crt" ] && [ -f "$pki/$stem.key" ] && return 0
  [ -z "$org" ] || subj="/O=$org/CN=$cn"
  tmp="$(mktemp -d "$pki/.$stem.XXXXXX")"
  (
    cd "$tmp"
    umask 077
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout key -out csr -subj "$subj" 2>/dev/null
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' \
      'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=clientAuth' >ext
    openssl x509 -req -in csr -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -CAserial "$tmp/serial" -sha256 -days 3650 -extfile ext -out crt 2>/dev/null
  )
  mv "$tmp/key" "$pki/$stem.key"
  mv "$tmp/crt" "$pki/$stem.crt"
  rm -rf "$tmp"
}
