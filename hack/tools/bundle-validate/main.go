// Command bundle-validate checks an OLM bundle directory with the operator-framework's
// own validators: the default bundle validators (CSV, CRDs, bundle), the OperatorHub
// suite (OperatorHub v2, standard capabilities, standard categories) and good practices.
//
//	bundle-validate [-k8s-version 1.34] [-warnings-as-errors] bundle/
//
// It prints one line per finding ("ERROR ..." or "WARN ...") and a summary, and exits
// 1 when there is an error (or a warning, with -warnings-as-errors), 2 when the
// bundle cannot be loaded at all.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

func main() {
	k8sVersion := flag.String("k8s-version", "", "Kubernetes version the deprecated-API checks assume (default: the CSV's minKubeVersion)")
	strict := flag.Bool("warnings-as-errors", false, "exit 1 on warnings too")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] BUNDLE_DIR\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)

	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR cannot load bundle %s: %v\n", dir, err)
		os.Exit(2)
	}

	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
	)
	objs := bundle.ObjectsToValidate()
	if *k8sVersion != "" {
		objs = append(objs, map[string]string{"k8s-version": *k8sVersion})
	}

	nErrors, nWarnings := 0, 0
	for _, result := range validators.Validate(objs...) {
		for _, e := range result.Errors {
			nErrors++
			report("ERROR", result.Name, e)
		}
		for _, w := range result.Warnings {
			nWarnings++
			report("WARN", result.Name, w)
		}
	}
	fmt.Printf("bundle %s (%s): %d errors, %d warnings\n", dir, bundle.Name, nErrors, nWarnings)
	if nErrors > 0 || (*strict && nWarnings > 0) {
		os.Exit(1)
	}
}

func report(level, name string, e errors.Error) {
	if name == "" {
		name = "-"
	}
	fmt.Printf("%s %s: %s\n", level, name, e.Error())
}
