#!/bin/sh
# Makes the secrets of the local compose cluster in DIR (the compose
# service gen-secrets runs it into the volume questd-secrets before any
# node starts; deploy/validate runs it too):
#
#   ca.pem                   a throwaway CA (ECDSA P-256, 825 days); its key
#                            is never written to DIR, so nothing can sign
#                            more
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
# The certificates come from `questctl tls` ($QUESTCTL, default questctl
# on PATH; the compose service runs the image's build stage, whose
# questctl is /out/questctl), the gossip key and the token from
# /dev/urandom through od and base64 (coreutils): no openssl.
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

questctl=${QUESTCTL:-questctl}
"$questctl" tls ca --dir "$tmp" --name questrt-compose-ca --days 825 >/dev/null

set -- $ips
for n in $names; do
	"$questctl" tls node "$n" --dir "$tmp" --host "$n,$1,localhost,127.0.0.1" --days 825 >/dev/null
	shift
done
"$questctl" tls client client --dir "$tmp" --days 825 >/dev/null

# rand N: N random bytes, in hex.
rand() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
head -c 32 /dev/urandom | base64 >"$tmp/gossip.key"
rand 32 >"$tmp/token"
echo >>"$tmp/token"

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
