#!/usr/bin/env bash
# Installs (once) the Debian packages the end-to-end tests run for real:
# prometheus and promtool (the metrics test scrapes the services with a
# real Prometheus, lints their exposition and checks the alert rules with
# promtool) and dnsmasq (the DNS membership test serves the members'
# records from a real DNS server on loopback).
set -euo pipefail
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v promtool >/dev/null || missing+=(prometheus)
command -v dnsmasq >/dev/null || missing+=(dnsmasq-base)
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
