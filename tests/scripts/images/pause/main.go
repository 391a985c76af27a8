// The process that holds a pod's namespaces on the test node (containerd's sandbox image): it
// waits for SIGTERM or SIGINT and exits 0. Built static (CGO_ENABLED=0) into an image of its own,
// because the public pause image cannot be pulled where the tests run.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
