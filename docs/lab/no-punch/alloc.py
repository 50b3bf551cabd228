import time, sys
import os; b = bytearray(os.urandom(int(sys.argv[1]) << 20))
for i in range(0, len(b), 4096): b[i] = (i >> 12) & 255; b[i+1:i+64] = bytes(range(63))
import os; x = os.urandom(1 << 20)
for i in range(0, len(b) - (1<<20), 1<<20): b[i+100:i+2000] = x[:1900]
print("done", time.time(), flush=True)
