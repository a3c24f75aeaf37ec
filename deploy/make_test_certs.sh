#!/usr/bin/env bash
# Makes throw-away TLS material for tests and local clusters in DIR (created if missing):
#   ca.pem ca.key                  a test CA
#   server.pem server.key          the ps certificate, signed by the CA; SAN localhost, 127.0.0.1
#                                  and each HOST given (a name, or an IPv4 or IPv6 address);
#                                  also a client certificate: replicas present it to their peer
#   client.pem client.key          a worker/evaluator certificate, signed by the CA
#   other-ca.pem other-ca.key      a second, unrelated CA
#   other-client.pem other-client.key   a client certificate signed by the unrelated CA
# EC P-256 keys, valid for 30 days. Never use these for anything that matters: the CA key sits
# next to the certificates. Usage: deploy/make_test_certs.sh DIR [HOST ...]
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [HOST ...]" >&2
  exit 2
fi
command -v openssl > /dev/null || { echo "$0: openssl not found (apt-get install openssl)" >&2; exit 1; }
dir=$1
shift
names="DNS:localhost,IP:127.0.0.1"
for host in "$@"; do
  if [[ $host =~ ^[0-9]+(\.[0-9]+){3}$ || $host == *:* ]]; then names+=",IP:$host"; else names+=",DNS:$host"; fi
done
mkdir -p "$dir"
cd "$dir"
umask 077  # private keys readable by their owner only

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2> /dev/null; }

# ca NAME SUBJECT: a self-signed CA.
ca() {
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 30 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

# leaf NAME CA SUBJECT EXTENSIONS: a certificate for NAME.key signed by CA.
leaf() {
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" "$4" \
    > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 30 \
    -extfile "$1.ext" -out "$1.pem" 2> /dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca "paramserver test CA"
leaf server ca "paramserver ps" $'extendedKeyUsage=serverAuth,clientAuth\n'"subjectAltName=$names"
leaf client ca "paramserver worker" "extendedKeyUsage=clientAuth"
ca other-ca "unrelated test CA"
leaf other-client other-ca "stranger" "extendedKeyUsage=clientAuth"
rm -f ./*.srl
chmod 644 ./*.pem
echo "test certificates in $dir: ca.pem, server.pem/.key, client.pem/.key, other-ca.pem, other-client.pem/.key"
