#!/bin/sh
# Writes to stderr and fails with status 3.
echo "something went wrong" >&2
exit 3
