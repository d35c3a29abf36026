#!/usr/bin/env bash
# What the tests need from the system that pip cannot install: Debian's Chromium for the browser
# tests and a Postgres answering on 127.0.0.1:5432. Idempotent; does nothing when both are there.
set -euo pipefail

if ! command -v chromium >/dev/null 2>&1; then
  echo "ensure-system: installing Debian's chromium (browser tests)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "ensure-system: starting Postgres on 127.0.0.1:5432"
  version=$(ls /etc/postgresql 2>/dev/null | sort -n | tail -n 1)
  if [ -z "$version" ]; then
    echo "ensure-system: no Postgres cluster under /etc/postgresql; the Postgres tests will fail" >&2
  else
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  fi
fi
