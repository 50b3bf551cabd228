// Built with CGO_ENABLED=0: a statically linked program the loader never gives the shim
// to. Writes 16 MiB, reads it back, prints "go static ok".
package main

import (
	"fmt"
	"os"
)

func main() {
	b := make([]byte, 16<<20)
	for i := range b {
		b[i] = byte(i * 7)
	}
	for i := range b {
		if b[i] != byte(i*7) {
			fmt.Fprintln(os.Stderr, "MISMATCH go static")
			os.Exit(1)
		}
	}
	fmt.Println("go static ok")
}
