#!/usr/bin/env bash
# `make run`, once make has built bin/ and written var/: the stand-in model API
# (examples/model-api) on the address $1, then Sandgate serving examples/sandgate.yaml, until
# Ctrl-C, which stops both.
#
# The stand-in binds before Sandgate starts, and its first line says whether it serves: a
# failure to bind is always printed (started side by side, it was killed unheard when Sandgate
# failed first). Sandgate starts either way, so that a second `make run` beside the first also
# says which listen.* setting is in the way.
set -uo pipefail
model_api=$1
exec 3< <(exec ./bin/model-api -listen "$model_api" -dir var/model-api -key-file var/secrets/anthropic 2>&1)
stand_in=$!
trap 'kill "$stand_in" 2>/dev/null' EXIT
IFS= read -r first <&3 || first=""
printf '%s\n' "$first" >&2
if [[ $first != "model-api: serving "* ]]; then
	echo "make run: the stand-in model API is not running (above): model requests through the proxy fail until it does" >&2
fi
cat <&3 >&2 & # the stand-in's line per request, as they come
SSL_CERT_FILE=var/model-api/ca.crt ./bin/sandgate serve --config examples/sandgate.yaml
