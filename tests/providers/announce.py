#!/usr/bin/env python3
"""Leaves a mark in the workspace ($GAFFER_WORKSPACE/NAME) that it was started, then hangs
(`announce.py NAME hang`) or runs the kv provider (`announce.py NAME kv`): the end-to-end tests
tell whether gaffer started a provider by it."""
import os
import runpy
import sys
import time

name, then = sys.argv[1], sys.argv[2]
open(os.path.join(os.environ["GAFFER_WORKSPACE"], name), "w").close()
if then == "hang":
    time.sleep(3600)
else:
    here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(os.path.join(here, "kv_provider.py"), run_name="__main__")
