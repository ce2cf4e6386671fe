// The prometheus-operator release whose CRDs (ServiceMonitor, PodMonitor, PrometheusRule)
// the chart's and config/'s monitoring objects are validated against. Nothing is built
// from it: hack/monitoring_crds.py downloads the module zip through this module and reads
// example/prometheus-operator-crd/ from it.
module github.com/thunder-compute/thunder-device-plugin/hack/tools/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.90.1
