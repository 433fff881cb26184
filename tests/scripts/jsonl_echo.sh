#!/bin/sh
# Echoes each JSON input line back unchanged, prefixed (printf: dash's echo expands escapes).
while IFS= read -r line; do
  printf 'json: %s\n' "$line"
done
