#!/usr/bin/env bash
# Installs Debian packages the tests need: apt-get install, after an
# apt-get update when the package lists lack them. Waits up to 5 minutes
# for another apt or dpkg run to release its lock instead of failing.
# Usage: bash scripts/apt-install.sh PACKAGE...
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=300 "$@"; }
apt_get install -y -qq "$@" >/dev/null 2>&1 ||
  { apt_get update -qq && apt_get install -y -qq "$@" >/dev/null; }
