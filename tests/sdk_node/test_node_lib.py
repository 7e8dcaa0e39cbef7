"""lib.js, what every Node script prints through: a script that ends must not cut its last lines. A script exiting
at once after printing a line longer than the pipe's buffer (a 60 KB body in base64) dropped the rest of it when
the reader was slow, and the test then missed that event (seen in CI: a body "missing" from the Node consumer)."""

from __future__ import annotations

import json
import os
import subprocess
import time

from devkit.nodesdk import SCRIPTS_DIR

BIG_LINES = """
'use strict';
const { emit, run } = require(process.argv[2]);
run(async () => { for (let i = 0; i < 3; i++) emit('big', { i, body: 'x'.repeat(200000) }); });
"""


def test_a_script_that_ends_leaves_every_line_it_printed_whole_for_a_slow_reader(tmp_path):
    script = tmp_path / "big.js"
    script.write_text(BIG_LINES)
    process = subprocess.Popen(["node", str(script), os.path.join(SCRIPTS_DIR, "lib.js")], stdout=subprocess.PIPE,
                               text=True)
    time.sleep(1.0)  # the pipe fills (64 KiB) while the script has ended and wants to exit
    lines = process.stdout.read().splitlines()
    assert process.wait(10) == 0
    assert [json.loads(line)["i"] for line in lines] == [0, 1, 2]
