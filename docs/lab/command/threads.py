import threading, random, sys, hashlib
N = int(sys.argv[1]); M = int(sys.argv[2]); T = 8
rng = random.Random(1)
d = {}
for i in range(N):
    d[i] = ("%08x" % rng.getrandbits(32)) * 40 + str(i)
res = [0] * T
def work(t):
    r = random.Random(100 + t); s = 0
    for j in range(M):
        k = r.randrange(N)
        v = d[k]
        s += len(v) + ord(v[3])
        if k % T == t and j % 4 == 0:
            d[k] = v[1:] + v[0]
    res[t] = s
ths = [threading.Thread(target=work, args=(t,)) for t in range(T)]
[x.start() for x in ths]; [x.join() for x in ths]
h = hashlib.sha256()
for i in range(0, N, 97): h.update(d[i].encode())
print(h.hexdigest())
