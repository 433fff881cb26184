#!/bin/sh
# Announces itself, then idles until stopped.
echo "sleeping"
while true; do
  sleep 1
done
