"""A node job's answer: one line on stdout, MARK then the answer as JSON, read back on the launch
node by `trainfleet.node.read_answer` (the last such line) or `read_answers` (every one).

    >>> send({"removed": 2})
    @@trainfleet-answer {"removed": 2}

The mark keeps the answer apart from whatever else reaches stdout (a profile script's words,
a library's prints); marks and progress lines that the launch node reads while a job runs
(the probe's on stderr) are not answers.
"""

import json
import sys

MARK = "@@trainfleet-answer "


def send(answer):
    """Writes `answer` (JSON values; the job's answer TypedDict) as the job's answer line."""
    sys.stdout.write(MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()
