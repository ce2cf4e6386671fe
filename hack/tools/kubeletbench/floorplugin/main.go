// Command floorplugin is the least a DRA kubelet plugin can do, on the upstream helper
// (k8s.io/dynamic-resource-allocation/kubeletplugin): NodePrepareResources answers each
// allocated device of the driver with one CDI device ID named after the claim, and
// NodeUnprepareResources answers success. It writes no file and keeps no state, so the
// time the kubelet waits on it is the protocol's and the helper's (which reads each claim
// from the API server) and no driver's work: the floor to compare a real driver with.
//
//	floorplugin --kubeconfig K --driver-name D --node N --registry-dir R --plugin-dir P
//
// It runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

type floor struct {
	driver string
}

// PrepareResourceClaims returns, for every device allocated to the claim by this driver,
// the CDI device ID "<driver>/gpu=<claim UID>-<device>". No CDI spec is written.
func (f *floor) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var devices []kubeletplugin.Device
		for _, result := range claim.Status.Allocation.Devices.Results {
			if result.Driver != f.driver {
				continue
			}
			devices = append(devices, kubeletplugin.Device{
				Requests:     []string{result.Request},
				PoolName:     result.Pool,
				DeviceName:   result.Device,
				CDIDeviceIDs: []string{fmt.Sprintf("%s/gpu=%s-%s", f.driver, claim.UID, result.Device)},
			})
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

// UnprepareResourceClaims has nothing to undo.
func (f *floor) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = nil
	}
	return out, nil
}

func (f *floor) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (f *floor) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func main() {
	var kubeconfig, driver, node, registryDir, pluginDir string
	var serialize bool
	klog.InitFlags(nil)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&driver, "driver-name", "", "DRA driver name to register as")
	flag.StringVar(&node, "node", "", "the node's name")
	flag.StringVar(&registryDir, "registry-dir", "", "kubelet plugins_registry directory for the registration socket")
	flag.StringVar(&pluginDir, "plugin-dir", "", "directory for the DRA service socket")
	flag.BoolVar(&serialize, "serialize", false, "let the helper serialize prepare and unprepare calls (its default; off here because this plugin shares no state)")
	flag.Parse()
	for name, value := range map[string]string{
		"kubeconfig": kubeconfig, "driver-name": driver, "node": node,
		"registry-dir": registryDir, "plugin-dir": pluginDir,
	} {
		if value == "" {
			fmt.Fprintf(os.Stderr, "floorplugin: --%s is required\n", name)
			os.Exit(64)
		}
	}
	if err := run(driver, node, kubeconfig, registryDir, pluginDir, serialize); err != nil {
		fmt.Fprintf(os.Stderr, "floorplugin: %v\n", err)
		os.Exit(1)
	}
}

func run(driver, node, kubeconfig, registryDir, pluginDir string, serialize bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS = -1 // no client-side rate limit: the floor is not to wait on itself
	restConfig.UserAgent = "floorplugin"
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	for _, dir := range []string{registryDir, pluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	helper, err := kubeletplugin.Start(ctx, &floor{driver: driver},
		kubeletplugin.DriverName(driver),
		kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.Serialize(serialize),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return err
	}
	<-ctx.Done()
	helper.Stop()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}
