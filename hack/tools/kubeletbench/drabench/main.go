// Command drabench drives the kubelet's own DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra)
// against whatever DRA kubelet plugin registers in a plugins_registry directory, and times
// its PrepareResources and UnprepareResources calls for pods whose claims are already
// allocated and reserved. It is what the kubelet runs between a pod's admission and its
// containers' start, without the rest of the kubelet.
//
//	drabench --kubeconfig K --node N --registry-dir D --state-dir S --claims claims.json \
//	    --in-flight 20 [--warmup 2] [--warmup-claims warmup.json] [--end-reservations] \
//	    [--cpu daemon=1234 --cpu kube-apiserver=5678]
//
// claims.json lists {"namespace", "claim", "pod", "pod_uid"} objects: each pod is given to
// the manager with one pod claim naming its ResourceClaim (which must list the pod in
// status.reservedFor). --in-flight workers each prepare a pod's claims and then unprepare
// them, taking the next pod until all are done. The untimed warm-up cycles take the first
// --warmup pods of claims.json, or those of --warmup-claims. With --end-reservations each
// pod's reservation is removed from its claim between the prepare and the unprepare,
// outside both timed calls, as the resourceclaim controller removes it once a pod has
// ended: a plugin that acts on reserved claims by itself (enrollment before binding) then
// leaves an unprepared claim alone. The result, one JSON object on stdout,
// has every call's seconds, the wall time, the CPU ticks of the named processes and of
// this one over the timed part, and the kubelet's own gRPC metric for the same span.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/metrics"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// PodClaim is one pod and the one ResourceClaim it uses.
type PodClaim struct {
	Namespace string `json:"namespace"`
	Claim     string `json:"claim"`
	Pod       string `json:"pod"`
	PodUID    string `json:"pod_uid"`
}

// GRPCTotals is the kubelet's gRPC histogram (count and sum) for one method.
type GRPCTotals struct {
	Count uint64  `json:"count"`
	Sum   float64 `json:"sum_s"`
}

// Result is what one run prints.
type Result struct {
	InFlight   int                   `json:"in_flight"`
	Prepare    []float64             `json:"prepare_s"`
	Unprepare  []float64             `json:"unprepare_s"`
	Wall       float64               `json:"wall_s"`
	CPUTicks   map[string]int64      `json:"cpu_ticks"`
	GRPC       map[string]GRPCTotals `json:"grpc"`
	Registered float64               `json:"registered_after_s"`
}

type cpuFlags map[string]int

func (c cpuFlags) String() string { return fmt.Sprint(map[string]int(c)) }

func (c cpuFlags) Set(value string) error {
	name, pid, ok := strings.Cut(value, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=pid, got %q", value)
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		return fmt.Errorf("pid of %s: %w", name, err)
	}
	c[name] = n
	return nil
}

// ticks is a process's user plus system CPU time, in clock ticks, from /proc/<pid>/stat.
func ticks(pid string) (int64, error) {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its closing ")" do not.
	text := string(raw)
	fields := strings.Fields(text[strings.LastIndexByte(text, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: %d fields", pid, len(fields))
	}
	user, err := strconv.ParseInt(fields[11], 10, 64)
	if err != nil {
		return 0, err
	}
	system, err := strconv.ParseInt(fields[12], 10, 64)
	if err != nil {
		return 0, err
	}
	return user + system, nil
}

func cpuSnapshot(pids cpuFlags) (map[string]int64, error) {
	out := map[string]int64{}
	for name, pid := range pids {
		t, err := ticks(strconv.Itoa(pid))
		if err != nil {
			return nil, fmt.Errorf("CPU of %s: %w", name, err)
		}
		out[name] = t
	}
	self, err := ticks("self")
	if err != nil {
		return nil, err
	}
	out["drabench"] = self
	return out, nil
}

// grpcSnapshot reads the kubelet's dra_grpc_operations_duration_seconds histogram, summed
// over drivers and status codes, keyed by the method's last path element.
func grpcSnapshot() (map[string]GRPCTotals, error) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]GRPCTotals{}
	for _, family := range families {
		if family.GetName() != "dra_grpc_operations_duration_seconds" {
			continue
		}
		for _, metric := range family.GetMetric() {
			method := ""
			for _, label := range metric.GetLabel() {
				if label.GetName() == "method_name" {
					method = label.GetValue()[strings.LastIndexByte(label.GetValue(), '/')+1:]
				}
			}
			totals := out[method]
			totals.Count += metric.GetHistogram().GetSampleCount()
			totals.Sum += metric.GetHistogram().GetSampleSum()
			out[method] = totals
		}
	}
	return out, nil
}

func podFor(c PodClaim) *v1.Pod {
	claim := c.Claim
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: c.Pod, Namespace: c.Namespace, UID: types.UID(c.PodUID)},
		Spec: v1.PodSpec{
			Containers:     []v1.Container{{Name: "c", Image: "busybox"}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
		},
	}
}

// between is what happens to a pod after its prepare and before its unprepare, untimed.
type between func(ctx context.Context, c PodClaim) error

// cycle prepares a pod's claims and then unprepares them, as the kubelet does when a pod
// starts and when it ends; ended (when not nil) runs in between, outside both timings.
func cycle(ctx context.Context, manager *dra.Manager, c PodClaim, ended between) (time.Duration, time.Duration, error) {
	pod := podFor(c)
	started := time.Now()
	if err := manager.PrepareResources(ctx, pod); err != nil {
		return 0, 0, fmt.Errorf("pod %s/%s: %w", c.Namespace, c.Pod, err)
	}
	prepare := time.Since(started)
	if ended != nil {
		if err := ended(ctx, c); err != nil {
			return 0, 0, fmt.Errorf("pod %s/%s: %w", c.Namespace, c.Pod, err)
		}
	}
	unprepared := time.Now()
	if err := manager.UnprepareResources(ctx, pod); err != nil {
		return 0, 0, fmt.Errorf("pod %s/%s: %w", c.Namespace, c.Pod, err)
	}
	return prepare, time.Since(unprepared), nil
}

// running is a pod's containers running for runFor after its prepare, then next (when not
// nil): the time between a real pod's start and its end, which the kubelet does not spend
// on the plugin.
func running(runFor time.Duration, next between) between {
	return func(ctx context.Context, c PodClaim) error {
		if runFor > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(runFor):
			}
		}
		if next != nil {
			return next(ctx, c)
		}
		return nil
	}
}

// endReservation removes the pod from its claim's status.reservedFor (a strategic merge
// patch deleting the entry of the pod's UID), as the resourceclaim controller does once
// the pod has ended. Its client is not the manager's, so the kubelet's rate limit is
// spent on the kubelet's own requests only.
func endReservation(client kubernetes.Interface) between {
	return func(ctx context.Context, c PodClaim) error {
		patch, err := json.Marshal(map[string]any{
			"status": map[string]any{
				"reservedFor": []map[string]string{{"$patch": "delete", "uid": c.PodUID}},
			},
		})
		if err != nil {
			return err
		}
		_, err = client.ResourceV1().ResourceClaims(c.Namespace).Patch(
			ctx, c.Claim, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		if err != nil {
			return fmt.Errorf("ending the reservation of claim %s: %w", c.Claim, err)
		}
		return nil
	}
}

// waitRegistered retries the first cycle until the plugin manager has registered the
// driver: a pod whose driver is not registered fails the manager's validation pass before
// anything is recorded, so the retry starts clean.
func waitRegistered(ctx context.Context, manager *dra.Manager, c PodClaim, ended between, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, _, err := cycle(ctx, manager, c, ended)
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "is not registered") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readClaims reads a JSON file of pods and their claims; it must list at least one.
func readClaims(path string) ([]PodClaim, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var claims []PodClaim
	if err := json.Unmarshal(raw, &claims); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(claims) == 0 {
		return nil, fmt.Errorf("%s lists no claims", path)
	}
	return claims, nil
}

func run(ctx context.Context, opts options) (*Result, error) {
	claims, err := readClaims(opts.claims)
	if err != nil {
		return nil, err
	}
	warmup := claims
	if opts.warmupClaims != "" {
		if warmup, err = readClaims(opts.warmupClaims); err != nil {
			return nil, err
		}
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	if err != nil {
		return nil, err
	}
	// As the kubelet talks to the API server: protobuf, and its default client rate limits.
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS = float32(opts.qps)
	restConfig.Burst = opts.burst
	restConfig.UserAgent = "drabench"
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, err
	}

	var ended between
	if opts.runFor > 0 {
		ended = running(opts.runFor, nil)
	}
	if opts.endReservations {
		controllerConfig := *restConfig
		controllerConfig.QPS, controllerConfig.Burst = 1000, 1000
		controllerConfig.UserAgent = "drabench-claim-controller"
		controller, err := kubernetes.NewForConfig(&controllerConfig)
		if err != nil {
			return nil, err
		}
		ended = running(opts.runFor, endReservation(controller))
	}

	kubeletmetrics.Register()
	logger := klog.FromContext(ctx)
	manager, err := dra.NewManager(logger, client, opts.stateDir)
	if err != nil {
		return nil, err
	}
	// Never ready: the manager's reconcile loop, which unprepares claims of pods that are
	// no longer active, stays idle; every unprepare here is an explicit call.
	sources := config.NewSourcesReady(func(sets.Set[string]) bool { return false })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, opts.node, metav1.GetOptions{})
	}
	noPods := func() []*v1.Pod { return nil }
	if err := manager.Start(ctx, noPods, getNode, sources); err != nil {
		return nil, err
	}
	defer manager.Stop()

	plugins := pluginmanager.NewPluginManager(opts.registryDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	stop := make(chan struct{})
	defer close(stop)
	go plugins.Run(ctx, sources, stop)

	started := time.Now()
	if err := waitRegistered(ctx, manager, warmup[0], ended, opts.registerTimeout); err != nil {
		return nil, fmt.Errorf("first prepare: %w", err)
	}
	registered := time.Since(started).Seconds()
	for i := 1; i < opts.warmup && i < len(warmup); i++ {
		if _, _, err := cycle(ctx, manager, warmup[i], ended); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}

	result := &Result{InFlight: opts.inFlight, Registered: registered}
	cpuBefore, err := cpuSnapshot(opts.cpu)
	if err != nil {
		return nil, err
	}
	grpcBefore, err := grpcSnapshot()
	if err != nil {
		return nil, err
	}

	var (
		mutex sync.Mutex
		next  int
		errs  []error
		wg    sync.WaitGroup
	)
	phase := time.Now()
	for w := 0; w < opts.inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mutex.Lock()
				if next >= len(claims) || len(errs) > 0 {
					mutex.Unlock()
					return
				}
				c := claims[next]
				next++
				mutex.Unlock()
				prepare, unprepare, err := cycle(ctx, manager, c, ended)
				mutex.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					result.Prepare = append(result.Prepare, prepare.Seconds())
					result.Unprepare = append(result.Unprepare, unprepare.Seconds())
				}
				mutex.Unlock()
			}
		}()
	}
	wg.Wait()
	result.Wall = time.Since(phase).Seconds()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	cpuAfter, err := cpuSnapshot(opts.cpu)
	if err != nil {
		return nil, err
	}
	result.CPUTicks = map[string]int64{}
	for name, after := range cpuAfter {
		result.CPUTicks[name] = after - cpuBefore[name]
	}
	grpcAfter, err := grpcSnapshot()
	if err != nil {
		return nil, err
	}
	result.GRPC = map[string]GRPCTotals{}
	for method, after := range grpcAfter {
		before := grpcBefore[method]
		result.GRPC[method] = GRPCTotals{Count: after.Count - before.Count, Sum: after.Sum - before.Sum}
	}
	return result, nil
}

type options struct {
	kubeconfig      string
	node            string
	registryDir     string
	stateDir        string
	claims          string
	warmupClaims    string
	endReservations bool
	runFor          time.Duration
	inFlight        int
	warmup          int
	qps             float64
	burst           int
	registerTimeout time.Duration
	cpu             cpuFlags
}

func main() {
	opts := options{cpu: cpuFlags{}}
	klog.InitFlags(nil)
	flag.StringVar(&opts.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&opts.node, "node", "", "the node's name (the manager wipes its ResourceSlices at start, as the kubelet does)")
	flag.StringVar(&opts.registryDir, "registry-dir", "", "plugins_registry directory to watch for plugins")
	flag.StringVar(&opts.stateDir, "state-dir", "", "directory for the manager's checkpoint (must exist)")
	flag.StringVar(&opts.claims, "claims", "", "JSON file of pods and their claims")
	flag.IntVar(&opts.inFlight, "in-flight", 1, "pods prepared and unprepared at once")
	flag.IntVar(&opts.warmup, "warmup", 2, "untimed cycles before the timed part; at least one is run, as it waits for the registration")
	flag.StringVar(&opts.warmupClaims, "warmup-claims", "", "JSON file of pods and their claims for the warm-up cycles (default: the first --warmup of --claims)")
	flag.BoolVar(&opts.endReservations, "end-reservations", false, "remove each pod from its claim's status.reservedFor between its prepare and its unprepare, untimed, as the resourceclaim controller does once a pod has ended")
	flag.DurationVar(&opts.runFor, "run-for", 0, "how long each pod runs between its prepare and its unprepare, untimed (0: unprepared at once)")
	flag.Float64Var(&opts.qps, "kube-api-qps", 50, "client rate limit (the kubelet's default kubeAPIQPS)")
	flag.IntVar(&opts.burst, "kube-api-burst", 100, "client burst (the kubelet's default kubeAPIBurst)")
	flag.DurationVar(&opts.registerTimeout, "register-timeout", 60*time.Second, "how long to wait for the plugin's registration")
	flag.Var(opts.cpu, "cpu", "name=pid of a process whose CPU time to report (repeatable)")
	flag.Parse()
	for name, value := range map[string]string{
		"kubeconfig": opts.kubeconfig, "node": opts.node, "registry-dir": opts.registryDir,
		"state-dir": opts.stateDir, "claims": opts.claims,
	} {
		if value == "" {
			fmt.Fprintf(os.Stderr, "drabench: --%s is required\n", name)
			os.Exit(64)
		}
	}
	if opts.inFlight < 1 {
		fmt.Fprintln(os.Stderr, "drabench: --in-flight must be at least 1")
		os.Exit(64)
	}
	ctx, cancel := context.WithCancel(context.Background())
	result, err := run(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "drabench: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(result); err != nil {
		fmt.Fprintf(os.Stderr, "drabench: %v\n", err)
		os.Exit(1)
	}
}
