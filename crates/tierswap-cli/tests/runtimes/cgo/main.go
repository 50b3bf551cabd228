// Fills MIB MiB of byte slices (1 MiB each) with bytes that depend on their place;
// "churn SECONDS" then keeps making short-lived slices (checked before they die) and
// replacing a live one now and then for that long; then every byte is read back twice. Built with cgo, so the Go runtime maps its memory through
// libc (where the shim sees it). Prints "go ok ..." when every byte was right, then
// "vmhwm_kib N" (the process's peak resident memory). Exit 1 otherwise.
package main

// #include <unistd.h>
import "C"

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func want(i, j int) byte {
	x := uint32(i)*0x9E3779B1 + uint32(j)*0x85EBCA77
	return byte(x ^ (x >> 15))
}

func vmhwmKib() int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if l := s.Text(); strings.HasPrefix(l, "VmHWM:") {
			n, _ := strconv.Atoi(strings.Fields(l)[1])
			return n
		}
	}
	return -1
}

func main() {
	_ = C.getpid()
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage: fill MIB")
		os.Exit(2)
	}
	bufs := make([][]byte, mib)
	for i := range bufs {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = want(i, j)
		}
		bufs[i] = b
	}
	bad, churned := 0, 0
	if len(os.Args) > 3 && os.Args[2] == "churn" {
		secs, _ := strconv.ParseFloat(os.Args[3], 64)
		end := time.Now().Add(time.Duration(secs * float64(time.Second)))
		seed := uint32(7)
		next := func() int { seed = seed*1103515245 + 12345; return int(seed >> 8) }
		for time.Now().Before(end) {
			for k := 0; k < 64; k++ {
				i := mib + next()%65536
				s := make([]byte, 16<<10)
				for j := range s {
					s[j] = want(i, j)
				}
				for j := range s {
					if s[j] != want(i, j) {
						bad++
					}
				}
				churned++
			}
			if mib > 0 {
				v := next() % mib
				for j, x := range bufs[v] {
					if x != want(v, j) {
						bad++
					}
				}
				b := make([]byte, 1<<20)
				for j := range b {
					b[j] = want(v, j)
				}
				bufs[v] = b
			}
		}
	}
	for pass := 0; pass < 2; pass++ {
		for i, b := range bufs {
			for j := range b {
				if b[j] != want(i, j) {
					bad++
				}
			}
		}
	}
	if bad != 0 {
		fmt.Fprintf(os.Stderr, "MISMATCH go: %d bytes wrong\n", bad)
		os.Exit(1)
	}
	fmt.Printf("go ok %d MiB, %d short-lived slices\n", mib, churned)
	fmt.Printf("vmhwm_kib %d\n", vmhwmKib())
}
