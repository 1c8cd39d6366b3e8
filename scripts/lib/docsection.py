#!/usr/bin/env python3
"""Writing a benchmark's table into its document, between two markers.

    docsection.py section DOC NAME FILE
        what stands between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in DOC becomes
        FILE's text (the markers are appended when DOC lacks them)
    docsection.py between DOC BEGIN END FILE [--append]
        what stands between the markers BEGIN and END becomes FILE's text, stripped, on lines
        of its own; without the markers: an error, or with --append the markers and the text
        appended to DOC (created when missing)
"""

import os
import sys


def section(text, name, sec):
    """TEXT with NAME's section (`<!-- NAME:begin -->` .. `<!-- NAME:end -->`) made SEC."""
    a, b = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    if a not in text or b not in text:
        text += "\n" + a + "\n" + b + "\n"
    i, j = text.index(a) + len(a), text.index(b)
    return text[:i] + "\n" + sec + text[j:]


def between(text, begin, end, body, append=False):
    """TEXT with what stands between BEGIN and END made BODY (stripped), on lines of its own."""
    body = body.strip()
    if begin not in text and append:
        return text + "\n" + begin + "\n" + body + "\n" + end + "\n"
    i = text.index(begin) + len(begin)
    j = text.index(end, i)
    return text[:i] + "\n" + body + "\n" + text[j:]


def _read(path):
    with open(path) as f:
        return f.read()


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def main(argv):
    if argv[0] == "section":
        doc, name, sec = argv[1:4]
        _write(doc, section(_read(doc), name, _read(sec)))
    elif argv[0] == "between":
        doc, begin, end, body = argv[1:5]
        append = "--append" in argv[5:]
        text = _read(doc) if os.path.exists(doc) or not append else ""
        _write(doc, between(text, begin, end, _read(body), append))
    else:
        sys.exit("docsection.py: unknown command %s" % argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
