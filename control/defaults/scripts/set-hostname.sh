#!/bin/sh
# Sets the node's host name from what mProv handed it at boot.
set -eu
name="${MPROV_HOSTNAME:-}"
if [ -z "$name" ]; then
    echo "MPROV_HOSTNAME is not set; leaving the host name alone" >&2
    exit 0
fi
echo "$name" > /etc/hostname
hostname "$name"
