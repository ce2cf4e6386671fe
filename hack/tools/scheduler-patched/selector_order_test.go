/*
A benchmark (not a test) of the DeviceClass selector's order through the unpatched
allocator, on zone pools as the operator publishes them: 4 models in one zone, 256
devices each in slices of 128, a pod asking for the model whose pool sorts last, so
that every device of the other three models is evaluated. Both selector forms run
in one process, alternating in every iteration, so the machine's load weighs on both
alike (reported as <form>-ms/op; the first Allocate also compiles the expression):

	hack/build-scheduler-patched.sh --test -run '^$' -bench SelectorOrder -count 6
*/

package incubating

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured/internal"
	"k8s.io/dynamic-resource-allocation/structured/internal/unpatched"
	"k8s.io/utils/ptr"
)

func operatorZone(models []string, devices, perSlice int) ([]*resourceapi.ResourceSlice, *v1.Node) {
	const driver, domain = "thundercompute.com", "thundercompute.com"
	var slices []*resourceapi.ResourceSlice
	for _, model := range models {
		pool := "zone-0/" + model
		count := (devices + perSlice - 1) / perSlice
		for s := range count {
			slice := &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("thunder.zone-0.%s.%d", model, s)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:       driver,
					Pool:         resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: int64(count)},
					NodeSelector: zoneSelector("zone-0"),
				},
			}
			for d := s * perSlice; d < min(devices, (s+1)*perSlice); d++ {
				slice.Spec.Devices = append(slice.Spec.Devices, resourceapi.Device{
					Name: fmt.Sprintf("%s-%d", model, d),
					Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
						domain + "/gpu_type":       {StringValue: ptr.To(model)},
						domain + "/gpu_type_label": {StringValue: ptr.To(model)},
						domain + "/zone":           {StringValue: ptr.To("zone-0")},
					},
				})
			}
			slices = append(slices, slice)
		}
	}
	return slices, testNode("node-0", "zone-0")
}

func BenchmarkSelectorOrder(b *testing.B) {
	models := []string{"a100", "a6000", "h100", "l4"}
	slices, node := operatorZone(models, 256, 128)
	forms := map[string]string{
		"driver-first":    `device.driver == "thundercompute.com" && device.attributes["thundercompute.com"].gpu_type_label == "l4"`,
		"attribute-first": `device.attributes["thundercompute.com"].gpu_type_label == "l4" && device.driver == "thundercompute.com"`,
	}
	state := AllocatedState{AllocatedDevices: sets.New[DeviceID](), AllocatedSharedDeviceIDs: sets.New[SharedDeviceID](), AggregatedCapacity: internal.NewConsumedCapacityCollection()}
	claims := claimFor("thunder-gpu-l4", 1)
	ctx := context.Background()
	names := []string{"driver-first", "attribute-first"}
	spent := map[string]time.Duration{}
	for b.Loop() {
		// Both forms in every iteration, so the machine's load weighs on them alike;
		// one Allocator per pod, one Allocate per node, as the scheduler does.
		for _, name := range names {
			lister := newClasses(celClass("thunder-gpu-l4", forms[name]))
			cache := cel.NewCache(10, cel.Features{})
			start := time.Now()
			a, err := unpatched.NewAllocator(ctx, SupportedFeatures, state, lister, slices, cache)
			if err != nil {
				b.Fatal(err)
			}
			if results, err := a.Allocate(ctx, node, claims); err != nil || len(results) != 1 {
				b.Fatalf("%s: allocation failed: %v %v", name, results, err)
			}
			spent[name] += time.Since(start)
		}
	}
	for _, name := range names {
		b.ReportMetric(float64(spent[name].Microseconds())/float64(b.N)/1000, name+"-ms/op")
	}
}
