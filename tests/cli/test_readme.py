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


def test_every_relative_link_of_the_docs_resolves_inside_the_repository():
    """README.md and docs/**/*.md: each relative Markdown link (outside code blocks) names a file or folder of
    the repository (a user's clone has nothing beside it)."""
    root = README.parent
    pages = [README, *sorted((root / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists() or root.resolve() not in path.parents:
                broken.append(f"{page.relative_to(root)}: {target}")
    assert not broken, broken
    assert len(pages) > 10
