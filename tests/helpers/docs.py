"""Code in Markdown: fenced and indented blocks, and the `python -m aogpt_jax...` commands of the
shell blocks (tests/test_docs.py runs them for README and docs/, tests/test_paper_commands.py the
README's paper-commands block)."""

import re
import shlex


def code_blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of every fenced block, and ("", body) of every indented block outside
  fences."""
  blocks, lines, i = [], text.splitlines(), 0
  prev_blank = True
  while i < len(lines):
    line = lines[i]
    if line.startswith("```"):
      lang, body, i = line[3:].strip(), [], i + 1
      while i < len(lines) and not lines[i].startswith("```"):
        body.append(lines[i])
        i += 1
      blocks.append((lang, "\n".join(body) + "\n"))
      i, prev_blank = i + 1, False
      continue
    if prev_blank and line.startswith("    ") and line.strip():
      body = []
      while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
        body.append(lines[i][4:])
        i += 1
      blocks.append(("", "\n".join(body).rstrip() + "\n"))
      prev_blank = False
      continue
    prev_blank = not line.strip()
    i += 1
  return blocks


def shell_commands(text: str) -> list[list[str]]:
  """Every `python -m aogpt_jax...` command in the shell blocks of ``text``, as argv (continuation
  lines joined, comments dropped, `A && B` chains split, VAR=value lines substituted)."""
  out = []
  for lang, body in code_blocks(text):
    if lang not in ("", "bash", "sh", "shell"):
      continue
    env = {}
    for line in body.replace("\\\n", " ").splitlines():
      if m := re.fullmatch(r"([A-Z0-9_]+)=(\S+)", line.strip()):
        env[m.group(1)] = m.group(2)
        continue
      for k, v in env.items():
        line = line.replace(f"${k}", v)
      try:
        words = shlex.split(line, comments=True)
      except ValueError:
        continue
      seg = []
      for w in words + ["&&"]:
        if w == "&&":
          if seg[:3] and seg[0] in ("python", "python3") and seg[1] == "-m" and \
              seg[2].startswith("aogpt_jax"):
            out.append(seg)
          seg = []
        else:
          seg.append(w)
  return out
