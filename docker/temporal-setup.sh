#!/bin/sh
# One-shot, once the server is healthy: the namespace playline runs in, and the search
# attributes plays upsert (the same list `playline setup --print` prints).
set -eu
temporal operator namespace describe --namespace "$NAMESPACE" >/dev/null 2>&1 \
  || temporal operator namespace create --namespace "$NAMESPACE" --retention 7d
for attribute in PlaylinePlay:Keyword PlaylineStatus:Keyword PlaylineRowsTotal:Int \
                 PlaylineRowsDone:Int PlaylineRowsFailed:Int PlaylineCredits:Double; do
  name=${attribute%%:*}
  type=${attribute##*:}
  temporal operator search-attribute create --namespace "$NAMESPACE" --name "$name" --type "$type" \
    || echo "search attribute $name exists"
done
