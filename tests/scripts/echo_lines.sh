#!/bin/sh
# Echoes every input line back with a prefix; "quit" ends the run with status 0.
echo "ready"
while IFS= read -r line; do
  printf 'echo: %s\n' "$line"
  if [ "$line" = "quit" ]; then
    exit 0
  fi
done
echo "stdin closed"
