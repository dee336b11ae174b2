#!/bin/sh
# Runs inside the new image root while it is built: a login prompt on ttyS0, so
# a node can be reached on its serial console (or a VM's).
set -eu
if [ -d /etc/systemd/system ]; then
    mkdir -p /etc/systemd/system/getty.target.wants
    ln -sf /lib/systemd/system/serial-getty@.service \
        /etc/systemd/system/getty.target.wants/serial-getty@ttyS0.service
fi
