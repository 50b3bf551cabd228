"""Writes the private writable pages of a running process (its heap and anonymous
mappings; all-zero pages left out) to a file, for `tierswap bench floor --data FILE`.

    python3 dump_heap.py PID OUT   (as root, or as the process's user with ptrace rights)
"""
import sys


def main(pid, out_path):
    pages = 0
    with open(out_path, "wb") as out, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in open(f"/proc/{pid}/maps"):
            fields = line.split()
            name = fields[5] if len(fields) > 5 else ""
            if fields[1] != "rw-p" or name not in ("", "[heap]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            for i in range(0, len(data), 4096):
                page = data[i : i + 4096]
                if page.count(0) != len(page):
                    out.write(page)
                    pages += 1
    print(f"{pid}: {pages} pages written to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
