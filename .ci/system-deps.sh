#!/usr/bin/env bash
# System packages the tests use: Debian's Chromium for the real-browser tests of the viewer.
# Installs only when missing and when allowed (root); otherwise those tests skip with a reason.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium (browser tests of the viewer) ..." >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "chromium could not be installed: browser tests will skip" >&2
else
  echo "chromium not found and not root: browser tests will skip" >&2
fi
exit 0
