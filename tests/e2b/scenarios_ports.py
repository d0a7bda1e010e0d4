"""Port URLs (`{port}-{sandboxID}.{domain}`): a sandbox serving HTTP and WebSocket on two
ports, started through the SDK the way E2B's docs show it (`commands.run(...,
background=True)`), and what `get_host` and `traffic_access_token` give the caller. The
servers are perl (the test base image has perl-base and openssl, no python or nc)."""

from e2b import Sandbox

# Answers every request with "METHOD PATH BODY", then closes.
HTTP_SERVER = r"""
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => $ARGV[0], Listen => 16, ReuseAddr => 1) or die $!;
while (my $c = $s->accept) {
  my $line = <$c>; my $len = 0;
  while (defined(my $h = <$c>)) { last if $h eq "\r\n"; $len = $1 if $h =~ /^Content-Length:\s*(\d+)/i }
  my $body = ''; read($c, $body, $len) if $len;
  my ($m, $p) = split / /, $line;
  my $out = "$m $p $body";
  print $c "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " . length($out)
    . "\r\nConnection: close\r\n\r\n$out";
  close $c;
}
"""

# A WebSocket echo server (RFC 6455, frames under 126 bytes): the accept key by openssl.
WS_SERVER = r"""
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => $ARGV[0], Listen => 16, ReuseAddr => 1) or die $!;
while (my $c = $s->accept) {
  my $key = '';
  while (defined(my $h = <$c>)) { last if $h eq "\r\n"; $key = $1 if $h =~ /^Sec-WebSocket-Key:\s*(\S+)/i }
  my $accept = qx(printf %s '${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11' | openssl dgst -sha1 -binary | base64);
  chomp $accept;
  print $c "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    . "Sec-WebSocket-Accept: $accept\r\n\r\n";
  while (read($c, my $head, 2) == 2) {
    my ($b0, $b1) = unpack('CC', $head);
    my $len = $b1 & 127;
    read($c, my $mask, 4);
    my $data = ''; read($c, $data, $len) if $len;
    $data ^= substr($mask x (1 + int($len / 4)), 0, $len);
    my $op = $b0 & 15;
    if ($op == 8) { print $c pack('CC', 0x88, 0); last }
    print $c pack('CC', 0x80 | $op, $len) . $data;
  }
  close $c;
}
"""


def serve_ports(args):
    """A new sandbox serving HTTP on args["http"] and a WebSocket echo on args["ws"]."""
    sbx = Sandbox.create(timeout=args["timeout"], network=args.get("network"))
    sbx.files.write("/tmp/http.pl", HTTP_SERVER)
    sbx.files.write("/tmp/ws.pl", WS_SERVER)
    sbx.commands.run(f"perl /tmp/http.pl {args['http']}", background=True)
    sbx.commands.run(f"perl /tmp/ws.pl {args['ws']}", background=True)
    return {
        "sandbox_id": sbx.sandbox_id,
        "http_host": sbx.get_host(args["http"]),
        "ws_host": sbx.get_host(args["ws"]),
        "traffic_token": sbx.traffic_access_token,
        "envd_token": sbx._envd_access_token,
    }


SCENARIOS = {"serve_ports": serve_ports}
