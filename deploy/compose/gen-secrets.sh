#!/bin/sh
# Makes the secrets of the local compose cluster in DIR (the compose
# service gen-secrets runs it into the volume questd-secrets before any
# node starts; deploy/validate runs it too):
#
#   ca.pem                   a throwaway CA (ECDSA P-256, 825 days); its key
#                            is never written, so nothing can sign more
#   questd-N.pem, .key       node questd-N's certificate (N = 0, 1, 2),
#                            server and client use, its role the URI SAN
#                            questrt://node/questd-N (so it may call the
#                            worker API, and the others place ranks on it
#                            only under that name), SANs questd-N, its
#                            static IP, localhost and 127.0.0.1 (the
#                            healthcheck and the ports published on the
#                            host's loopback)
#   client.pem, client.key   a client certificate for questctl
#                            (questctl status --tls-dir DIR), its role
#                            the URI SAN questrt://client/client: the
#                            client API only
#   gossip.key               base64 of 32 random bytes (--gossip-key-file)
#   token                    64 hex digits (--token-file; questctl
#                            --token-file, OpenAI clients' API key)
#
# Keys and token mode 0400, certificates 0444; with SECRETS_OWNER=UID:GID
# (the compose service sets 65532:65532, the image's user) they are
# chowned to it, so questd, which refuses a secret file other users can
# read, reads them as their owner. A DIR that already holds a token is
# left as it is (a restart keeps the cluster's secrets): remove the volume
# (docker compose down -v) for new ones.
#
# Needs openssl 1.1.1 or later (-addext); golang:*-bookworm has it.
set -eu

dir=${1:?usage: gen-secrets.sh DIR}
ips="172.28.0.10 172.28.0.11 172.28.0.12"
names="questd-0 questd-1 questd-2"

mkdir -p "$dir"
if [ -s "$dir/token" ]; then
	echo "gen-secrets: $dir already has secrets, kept"
	exit 0
fi

umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
	-keyout "$tmp/ca.key" -out "$tmp/ca.pem" -days 825 -subj "/CN=questrt-compose-ca" \
	-addext "basicConstraints=critical,CA:TRUE" \
	-addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# leaf NAME CN SAN: a certificate NAME.pem and key NAME.key signed by the CA.
leaf() {
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$tmp/$1.key" -out "$tmp/$1.csr" -subj "/CN=$2" 2>/dev/null
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature"
		echo "extendedKeyUsage=$4"
		echo "subjectAltName=$3"
	} >"$tmp/$1.ext"
	openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
		-days 825 -sha256 -extfile "$tmp/$1.ext" -out "$tmp/$1.pem" 2>/dev/null
}

set -- $ips
for n in $names; do
	leaf "$n" "$n" "URI:questrt://node/$n,DNS:$n,IP:$1,DNS:localhost,IP:127.0.0.1" serverAuth,clientAuth
	shift
done
leaf client client "URI:questrt://client/client,DNS:client" clientAuth

openssl rand -base64 32 >"$tmp/gossip.key"
openssl rand -hex 32 >"$tmp/token"

certs="ca.pem client.pem" keys="client.key gossip.key"
for n in $names; do
	certs="$certs $n.pem" keys="$keys $n.key"
done
for f in $certs; do
	cp "$tmp/$f" "$dir/$f"
	chmod 0444 "$dir/$f"
done
for f in $keys; do
	cp "$tmp/$f" "$dir/$f"
	chmod 0400 "$dir/$f"
done
# The token last: its presence marks a complete DIR.
cp "$tmp/token" "$dir/token.new"
chmod 0400 "$dir/token.new"
if [ -n "${SECRETS_OWNER:-}" ]; then
	chown "$SECRETS_OWNER" "$dir" "$dir"/*
fi
mv "$dir/token.new" "$dir/token"
echo "gen-secrets: wrote $dir: $certs $keys token"
