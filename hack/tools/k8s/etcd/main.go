// Command etcd runs etcd's own entry point, built at the version that the
// pinned k8s.io/apiserver requires, for the local control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
