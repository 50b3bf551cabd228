"""A Python heap to dump: a dict of 600,000 short strings of words and a list of 300,000
small lists, then a pause for dump_heap.py."""
import random
import sys
import time

random.seed(1)
words = ["user", "name", "id", "value", "alpha", "beta", "x"]
d = {i: ("%x-" % i) + " ".join(random.choice(words) for _ in range(20)) for i in range(600000)}
rows = [[random.random(), i, str(i)] for i in range(300000)]
print("ready", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 30)
