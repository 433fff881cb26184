#!/bin/sh
# Reports which environment variables the worker received (names only, except the demo one).
env | cut -d= -f1 | sort | tr '\n' ' '
echo
echo "DEMO_TOKEN=${DEMO_TOKEN:-unset}"
echo "HOME=${HOME:-unset}"
echo "pwd-has-marker=$(test -f gaffer-test-marker && echo yes || echo no)"
