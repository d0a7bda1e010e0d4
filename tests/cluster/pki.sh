# Client certificates signed by the test CA (sourced by up.sh and tests/setup/node.sh).

# issue_ca <dir> <CN>: a self-signed CA (ca.crt/ca.key) in <dir>, unless it exists.
# The front proxy (the aggregation layer) has its own, as kubeadm sets it up: a
# client certificate of the cluster CA must not be able to assert users in headers.
issue_ca() {
  local dir="$1" cn="$2" tmp
  [ -f "$dir/ca.crt" ] && [ -f "$dir/ca.key" ] && return 0
  mkdir -p "$dir"
  tmp="$(mktemp -d "$dir/.ca.XXXXXX")"
  (
    cd "$tmp"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
      -keyout ca.key -out ca.crt -subj "/CN=$cn" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  )
  mv "$tmp/ca.key" "$dir/ca.key"
  mv "$tmp/ca.crt" "$dir/ca.crt"
  rm -rf "$tmp"
}

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
