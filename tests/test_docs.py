"""The documents' commands run as written: every bash block of README.md and docs/*.md titled "# try it:", in a
folder of its own with the pack on PYTHONPATH (what the docs say to do outside the pack's folder) and the pack's
workflows/ and tests/ beside it, `python` being this interpreter."""

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, require


def documented_commands() -> dict[str, str]:
    """{"document: title": block} of the blocks titled "# try it: ..."."""
    blocks = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in path.read_text(encoding="utf-8").split("```bash\n")[1:]:
            block = block.split("```", 1)[0]
            if block.startswith("# try it:"):
                blocks[f"{path.name}: {block.splitlines()[0].removeprefix('# try it: ')}"] = block
    return blocks


def test_the_documents_have_commands_to_try():
    titles = " ".join(documented_commands())
    for document in ("causal.md", "python-api.md"):
        assert document in titles


@pytest.mark.slow  # fresh processes, each making and loading a checkpoint
@pytest.mark.parametrize("title", sorted(documented_commands()), ids=lambda title: re.sub(r"\W+", "-", title)[:70])
def test_the_documented_commands_run(title, tmp_path):
    block = documented_commands()[title]
    if "modelopt_files.py" in block:
        require("modelopt.torch.quantization")
    for folder in ("workflows", "tests"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    script = re.sub(r"^(\.venv/bin/)?python3? ", f"{shlex.quote(sys.executable)} ", block, flags=re.M)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "wrote " in done.stdout
