#!/bin/sh
# Prints its arguments, one per line, then exits.
for a in "$@"; do
  echo "arg: $a"
done
