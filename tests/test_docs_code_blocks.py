"""docs/run_code_blocks.py, the runner that executes every code block of the docs: shell blocks
run and fail as they should, their options work, and unmarked or mis-marked blocks are errors."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("run_code_blocks", os.path.join(ROOT, "docs", "run_code_blocks.py"))
runner = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = runner  # dataclasses look their module up there
spec.loader.exec_module(runner)


def run_page(tmp_path, capsys, text: str) -> tuple[int, str]:
    page = tmp_path / "page.md"
    page.write_text(text)
    code = runner.main([str(page)])
    return code, capsys.readouterr().out


def test_shell_blocks_run_in_a_directory_that_sees_the_repository(tmp_path, capsys):
    code, out = run_page(tmp_path, capsys, """
```python
print("hello from app.py")
```

<!-- docs-run: shell previous=app.py copy=README.md:readme.txt -->
```bash
python app.py | grep -q "hello from app.py"
grep -q iris readme.txt
test -f examples/run.py
python -c "import sys; assert sys.prefix"
```
""")
    assert code == 0, out
    assert "2 blocks run, 0 skipped" in out, out


def test_a_failing_command_fails_the_block(tmp_path, capsys):
    code, out = run_page(tmp_path, capsys, """
<!-- docs-run: shell -->
```bash
echo first
false
echo never
```
""")
    assert code == 1, out
    assert "FAIL" in out and "first" in out and "never" not in out, out


def test_unmarked_and_mismarked_blocks_are_errors(tmp_path, capsys):
    code, out = run_page(tmp_path, capsys, """
```bash
echo unmarked
```

<!-- docs-run: shell bogus=1 -->
```bash
echo bad option
```

<!-- docs-run: shell -->
```python
print("a python block marked shell")
```

<!-- docs-run: shell previous=app.py -->
```bash
echo no python block above
```
""")
    assert code == 1, out
    assert "a bash block with no marker" in out, out
    assert "unknown shell option 'bogus=1'" in out, out
    assert "'docs-run: shell' on a python block" in out, out
    assert "previous=app.py: no Python block above" in out, out
