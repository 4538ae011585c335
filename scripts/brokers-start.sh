#!/usr/bin/env bash
# Makes sure the brokers the adapters' tests use answer, then exits 0:
# NATS with JetStream on 127.0.0.1:4222 (NATS_ADDR) and RabbitMQ on
# 127.0.0.1:5672 (RABBITMQ_ADDR, guest/guest). A broker that answers is left
# alone; one that does not is started, after installing Debian's
# nats-server or rabbitmq-server when missing (as root). Kafka needs nothing:
# its tests run franz-go's kfake in process.
set -euo pipefail

nats_addr="${NATS_ADDR:-127.0.0.1:4222}"
rabbit_addr="${RABBITMQ_ADDR:-127.0.0.1:5672}"
state="${LEASESTORE_BROKERS_DIR:-${TMPDIR:-/tmp}/leasestore-brokers}"

log() { echo "brokers-start: $*" >&2; }

# nats_answers: the server's INFO line says JetStream is on.
nats_answers() {
  local info=""
  { exec 3<>"/dev/tcp/${nats_addr%:*}/${nats_addr##*:}"; } 2>/dev/null || return 1
  read -r -t 3 info <&3 || true
  exec 3<&-
  [[ "$info" == INFO* && "$info" == *'"jetstream":true'* ]]
}

# rabbit_answers: the AMQP port accepts a connection and answers the
# protocol header with a frame (connection.start).
rabbit_answers() {
  local frame=""
  { exec 3<>"/dev/tcp/${rabbit_addr%:*}/${rabbit_addr##*:}"; } 2>/dev/null || return 1
  printf 'AMQP\x00\x00\x09\x01' >&3
  IFS= read -r -t 3 -n 1 -d '' frame <&3 || true
  exec 3<&-
  [ "$frame" = $'\x01' ]
}

wait_for() {
  for _ in $(seq 1 60); do
    "$1" && return 0
    sleep 0.5
  done
  return 1
}

install() {
  if [ "$(id -u)" != 0 ]; then
    log "$1 is not installed and this is not root: install it, or start a server at the address"
    return 1
  fi
  bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" "$1"
}

mkdir -p "$state"

if nats_answers; then
  log "NATS: JetStream answers at $nats_addr"
else
  bin="$(command -v nats-server || true)"
  [ -n "$bin" ] || [ -x /usr/sbin/nats-server ] || install nats-server
  bin="${bin:-/usr/sbin/nats-server}"
  [ -x "$bin" ] || bin="$(command -v nats-server)"
  log "NATS: starting $bin on $nats_addr (store in $state/nats)"
  setsid "$bin" -a "${nats_addr%:*}" -p "${nats_addr##*:}" -js -sd "$state/nats" -l "$state/nats.log" </dev/null >/dev/null 2>&1 &
  wait_for nats_answers || { log "NATS did not answer; $state/nats.log:"; tail -n 20 "$state/nats.log" >&2 || true; exit 1; }
  log "NATS: ready"
fi

if rabbit_answers; then
  log "RabbitMQ: answers at $rabbit_addr"
else
  [ -x /usr/sbin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null || install rabbitmq-server
  log "RabbitMQ: starting rabbitmq-server (guest/guest from loopback)"
  # Debian's wrapper runs the broker as the rabbitmq user; -detached returns at once.
  RABBITMQ_NODE_IP_ADDRESS="${rabbit_addr%:*}" RABBITMQ_NODE_PORT="${rabbit_addr##*:}" \
    setsid rabbitmq-server -detached </dev/null >"$state/rabbitmq.log" 2>&1 || true
  wait_for rabbit_answers || { log "RabbitMQ did not answer; $state/rabbitmq.log:"; tail -n 20 "$state/rabbitmq.log" >&2 || true; exit 1; }
  log "RabbitMQ: ready"
fi
