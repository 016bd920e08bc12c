"""The README's quickstart runs as written."""

import re

from tests.support.paths import README


def test_quickstart_runs_and_commits_valid_tokens(capsys):
    block = re.search(r"## Quickstart\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 12
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    tokens, count = namespace["tokens"], namespace["count"]
    assert tokens.shape == (2, 4) and ((count >= 1) & (count <= 4)).all()
    assert count[1] <= 2  # the second row drafted one token
    shown = re.search(r"## Quickstart\n\n```python\n.*?```\n\nprints,[^\n]*\n\n```\n(.*?)```", README.read_text(), re.S)
    assert capsys.readouterr().out == shown.group(1)  # the README shows what it prints
