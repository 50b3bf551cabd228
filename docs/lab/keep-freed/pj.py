import json, hashlib
data = [{"id": i, "name": "item%d" % i, "tags": ["t%d" % (i % 97), "u%d" % (i % 13)], "vals": [i * 0.5, i % 1000, -i], "desc": "x" * (i % 50)} for i in range(500_000)]
s = json.dumps(data)
print(len(s))
del data
back = json.loads(s)
s2 = json.dumps(back)
print(s == s2, len(back), hashlib.sha256(s2.encode()).hexdigest())
