// Command pause is the process that holds a pod's namespaces open on the test
// node (the role of the "pause" container). No registry is reachable from the
// test machine, so tests/setup/node.sh builds this statically and packs it
// into a local image that containerd uses as its sandbox image.
//
// It sleeps until SIGINT or SIGTERM (then exits 0) and, being PID 1 when the
// pod shares one PID namespace, reaps every child that is re-parented to it.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child without blocking; SIGCHLD signals coalesce,
// so one signal may stand for several exits.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
