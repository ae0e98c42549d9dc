#!/bin/sh
# make_certs.sh DIR - the certificates the TLS tests use, made with the
# openssl command line:
#   ca.pem, ca.key            a test CA
#   server.pem, server.key    signed by it for localhost and 127.0.0.1
#   client.pem, client.key    a client certificate signed by it
#   expired.pem, expired.key  signed by it, valid only in 2020
#   other-ca.pem              another CA, which signed nothing here
#   rogue.pem, rogue.key      signed by other-ca for localhost
#   elsewhere.pem, .key       signed by ca, for elsewhere.test only
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
[ -s server.pem ] && [ -s expired.pem ] && [ -s elsewhere.pem ] && exit 0
q() { "$@" >/dev/null 2>&1 || { echo "make_certs: failed: $*" >&2; exit 1; }; }

ca() { # name
  q openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.pem" \
    -days 3650 -subj "/CN=rebound test $1" \
    -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign
}

leaf() { # name ca extensions [ca-args]
  name=$1 signer=$2 ext=$3
  shift 3
  q openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" \
    -subj "/CN=$name"
  printf '%s\n' "$ext" > "$name.ext"
  q openssl x509 -req -in "$name.csr" -CA "$signer.pem" -CAkey "$signer.key" \
    -CAcreateserial -out "$name.pem" -days 825 -extfile "$name.ext" "$@"
}

ca ca
ca other-ca
server_ext='subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth'
leaf server ca "$server_ext"
leaf client ca 'extendedKeyUsage=clientAuth'
leaf rogue other-ca "$server_ext"
leaf elsewhere ca 'subjectAltName=DNS:elsewhere.test
extendedKeyUsage=serverAuth'

# expired: openssl ca sets both dates
mkdir -p ca.db
: > ca.db/index.txt
echo 1000 > ca.db/serial
cat > ca.cnf <<CNF
[ca]
default_ca = test
[test]
dir = ca.db
database = ca.db/index.txt
serial = ca.db/serial
new_certs_dir = ca.db
certificate = ca.pem
private_key = ca.key
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = leaf
[any]
commonName = supplied
[leaf]
subjectAltName = DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth
CNF
q openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr \
  -subj "/CN=expired"
q openssl ca -batch -config ca.cnf -in expired.csr -out expired.pem \
  -startdate 20200101000000Z -enddate 20200201000000Z
