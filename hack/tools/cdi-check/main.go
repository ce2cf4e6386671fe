// Command cdi-check validates CDI spec files with the reference CDI implementation
// (tags.cncf.io/container-device-interface) and applies devices to an OCI runtime spec,
// as containerd and CRI-O do when the kubelet hands them CDI device IDs. The project's
// tests use it as an independent check of the specs the Python daemon writes.
//
//	cdi-check --spec-dir DIR --oci-spec config.json DEVICE_ID...
//
// It loads every spec in DIR (strict parsing, version and name checks), prints each
// error to stderr and exits 1 if there is any; otherwise it injects the devices into
// the OCI spec read from config.json and prints the result as JSON on stdout. An
// unresolvable device ID also exits 1.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	os.Exit(run())
}

func run() int {
	specDir := flag.String("spec-dir", "", "directory holding the CDI spec files (required)")
	ociPath := flag.String("oci-spec", "", "OCI runtime config.json to inject into (required)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: cdi-check --spec-dir DIR --oci-spec config.json DEVICE_ID...")
		flag.PrintDefaults()
	}
	flag.Parse()
	devices := flag.Args()
	if *specDir == "" || *ociPath == "" || len(devices) == 0 {
		flag.Usage()
		return 2
	}

	cache, err := cdi.NewCache(cdi.WithSpecDirs(*specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdi-check: creating the CDI cache: %v\n", err)
		return 1
	}
	// Refresh's combined error repeats what GetErrors reports per file; print the latter.
	_ = cache.Refresh()
	if reportErrors(cache.GetErrors()) {
		return 1
	}

	raw, err := os.ReadFile(*ociPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdi-check: %v\n", err)
		return 1
	}
	var spec oci.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-check: parsing %s: %v\n", *ociPath, err)
		return 1
	}
	unresolved, err := cache.InjectDevices(&spec, devices...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdi-check: %v (unresolved: %v)\n", err, unresolved)
		return 1
	}

	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(&spec); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-check: writing the OCI spec: %v\n", err)
		return 1
	}
	return 0
}

// reportErrors prints every spec error, sorted by file, and says whether there was one.
func reportErrors(errs map[string][]error) bool {
	paths := make([]string, 0, len(errs))
	for path, list := range errs {
		if len(list) > 0 {
			paths = append(paths, path)
		}
	}
	sort.Strings(paths)
	for _, path := range paths {
		for _, err := range errs[path] {
			fmt.Fprintf(os.Stderr, "cdi-check: %s: %v\n", path, err)
		}
	}
	return len(paths) > 0
}
