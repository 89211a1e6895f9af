#!/bin/sh
# Entrypoint of deploy/local/rabbitmq.Containerfile: what the official image's
# does for the variables deploy/compose.yaml sets, then the command.
set -eu
if [ "${1:-}" = rabbitmq-server ]; then
    if [ -n "${RABBITMQ_DEFAULT_USER:-}" ] || [ -n "${RABBITMQ_DEFAULT_PASS:-}" ]; then
        : "${RABBITMQ_DEFAULT_USER:?RABBITMQ_DEFAULT_USER must be set with RABBITMQ_DEFAULT_PASS}"
        : "${RABBITMQ_DEFAULT_PASS:?RABBITMQ_DEFAULT_PASS must be set with RABBITMQ_DEFAULT_USER}"
        umask 077
        printf 'default_user = %s\ndefault_pass = %s\n' "$RABBITMQ_DEFAULT_USER" "$RABBITMQ_DEFAULT_PASS" \
            >/etc/rabbitmq/conf.d/05-default-user.conf
        chown rabbitmq:rabbitmq /etc/rabbitmq/conf.d/05-default-user.conf
        umask 022
    fi
    chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
    # The server itself as PID 1's program, so SIGTERM reaches it (Debian's
    # /usr/sbin wrapper would run it under su).
    export HOME=/var/lib/rabbitmq
    exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server
fi
exec "$@"
