#!/bin/sh
# privnet container entrypoint. As a plain user (the image's default) it runs the command as
# is. As root (docker-compose.yml starts the orchestrator so) it makes /app/runs, where the
# host's output directory is mounted, writable, then runs the command as that directory's
# owner, so the files on the host belong to whoever owns ./runs. A root-owned directory (one
# Docker created for the mount, or a root host) is first handed to the image's user privnet.
# The command never runs as root; exec keeps it PID 1, so it gets `docker stop` itself.
set -eu
if [ "$(id -u)" != 0 ]; then
    exec "$@"
fi
out=/app/runs
mkdir -p "$out"
if [ "$(stat -c %u "$out")" = 0 ]; then
    chown privnet:privnet "$out"
fi
uid=$(stat -c %u "$out")
gid=$(stat -c %g "$out")
if [ "$gid" = 0 ]; then
    gid=$(id -g privnet)
fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups "$@"
