"""Writes the sort lab's input: 8,000,000 lines of six words (from a 5,000-word vocabulary
of 3-8 lowercase letters) and a 40-bit number, 416 MB, the same bytes every time.

    python3 gen_sort_input.py sort.in
"""
import random
import sys

r = random.Random(7)
words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(3, 9))) for _ in range(5000)]
with open(sys.argv[1], "w") as f:
    for _ in range(8_000_000):
        f.write(" ".join(r.choice(words) for _ in range(6)) + " %d\n" % r.getrandbits(40))
