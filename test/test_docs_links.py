"""The README and docs/: every relative link reaches a file of this repository and every
#anchor a heading of its target (GitHub's heading slugs); the README keeps its shape (the two
set-up commands first, the ROS 2 section early, well under 300 lines). Pure Python."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / 'README.md'] + sorted((ROOT / 'docs').glob('*.md'))
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


def strip_code(text: str) -> str:
    """Markdown without fenced blocks and inline code (links there are not links)."""
    text = re.sub(r'^```.*?^```', '', text, flags=re.M | re.S)
    return re.sub(r'`[^`\n]*`', '', text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace('`', '')
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path: pathlib.Path) -> set:
    seen, out = {}, set()
    text = re.sub(r'^```.*?^```', '', path.read_text(), flags=re.M | re.S)
    for line in text.splitlines():
        match = re.match(r'#{1,6} (.+)', line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f'{base}-{count}')
    return out


def links(path: pathlib.Path):
    for target in LINK.findall(strip_code(path.read_text())):
        if not re.match(r'[a-z]+:', target):        # http:, https:, mailto:
            yield target


def test_slugs_follow_github():
    assert slug('Recorded results (2-core CPU, float32, evaluation seeds)') == \
        'recorded-results-2-core-cpu-float32-evaluation-seeds'
    assert slug('What `bash scripts/demo.sh` shows') == 'what-bash-scriptsdemosh-shows'


@pytest.mark.parametrize('document', DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(document):
    broken = []
    for target in links(document):
        file_part, _, anchor = target.partition('#')
        path = (document.parent / file_part).resolve() if file_part else document
        if not path.exists():
            broken.append(f'{target}: no such file')
        elif anchor and path.suffix == '.md' and anchor not in anchors(path):
            broken.append(f'{target}: no heading with that anchor in {path.name}')
    assert not broken, f'{document.name}: ' + '; '.join(broken)


def test_the_readme_starts_with_the_two_setup_commands_and_stays_short():
    text = (ROOT / 'README.md').read_text()
    lines = text.splitlines()
    assert len(lines) < 300
    commands = [line for line in strip_code_keep_fences(text) if line.startswith('bash ')]
    assert commands[:2] == ['bash scripts/demo.sh', 'bash scripts/test.sh']
    ros = next(i for i, line in enumerate(lines) if line.startswith('## ') and 'ROS 2' in line)
    assert ros < 100


def strip_code_keep_fences(text: str):
    """The lines inside fenced code blocks, in order."""
    inside, out = False, []
    for line in text.splitlines():
        if line.startswith('```'):
            inside = not inside
        elif inside:
            out.append(line.strip())
    return out
