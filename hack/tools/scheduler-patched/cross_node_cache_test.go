/*
Tests of allocator-cross-node-cache.patch. hack/build-scheduler-patched.sh --test copies
this file into the patched k8s.io/dynamic-resource-allocation as
structured/internal/incubating/cross_node_cache_test.go, next to upstream's own
allocator tests, and the unpatched incubating allocator as
structured/internal/unpatched, so both allocators run on the same input in one binary.
*/

package incubating

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured/internal"
	"k8s.io/dynamic-resource-allocation/structured/internal/unpatched"
	"k8s.io/utils/ptr"
)

const (
	gpuDriver   = "gpu.example.com"
	otherDriver = "other.example.com"
	zoneLabel   = "topology.kubernetes.io/zone"
)

// classes is a DeviceClassLister over a map that a test may change between calls.
type classes struct {
	mu     sync.Mutex
	byName map[string]*resourceapi.DeviceClass
}

func newClasses(list ...*resourceapi.DeviceClass) *classes {
	c := &classes{byName: map[string]*resourceapi.DeviceClass{}}
	for _, class := range list {
		c.byName[class.Name] = class
	}
	return c
}

func (c *classes) List() ([]*resourceapi.DeviceClass, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*resourceapi.DeviceClass
	for _, class := range c.byName {
		out = append(out, class)
	}
	return out, nil
}

func (c *classes) Get(name string) (*resourceapi.DeviceClass, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	class, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("deviceclass %q not found", name)
	}
	return class, nil
}

func (c *classes) set(class *resourceapi.DeviceClass) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byName[class.Name] = class
}

func celClass(name string, expressions ...string) *resourceapi.DeviceClass {
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, expression := range expressions {
		class.Spec.Selectors = append(class.Spec.Selectors,
			resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expression}})
	}
	return class
}

func modelClass(model string, attributeFirst bool) *resourceapi.DeviceClass {
	driver := fmt.Sprintf("device.driver == %q", gpuDriver)
	attribute := fmt.Sprintf("device.attributes[%q].gpu_type == %q", gpuDriver, model)
	if attributeFirst {
		return celClass("gpu-"+model, attribute+" && "+driver)
	}
	return celClass("gpu-"+model, driver+" && "+attribute)
}

func gpu(name, model, zone string, index int) resourceapi.Device {
	return resourceapi.Device{
		Name: name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpu_type": {StringValue: ptr.To(model)},
			"zone":     {StringValue: ptr.To(zone)},
			"index":    {IntValue: ptr.To(int64(index))},
		},
	}
}

func zoneSelector(zone string) *v1.NodeSelector {
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{
			{Key: zoneLabel, Operator: v1.NodeSelectorOpIn, Values: []string{zone}},
		},
	}}}
}

func testNode(name, zone string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{zoneLabel: zone}}}
}

// inventory is a generated cluster: nodes in zones, zone pools of several models split
// into several slices (listed in random order), node-local slices, a slice for all
// nodes of another driver, a slice with per-device node selection, an incomplete
// pool, some devices already allocated.
type inventory struct {
	nodes     []*v1.Node
	slices    []*resourceapi.ResourceSlice
	classes   []*resourceapi.DeviceClass
	allocated sets.Set[DeviceID]
	models    []string
}

func generate(seed uint64) inventory {
	rng := rand.New(rand.NewPCG(seed, 7))
	inv := inventory{allocated: sets.New[DeviceID]()}
	zones := 2 + rng.IntN(3)
	nodes := zones * (2 + rng.IntN(4))
	inv.models = []string{"a100", "h100", "l4", "b200"}[:1+rng.IntN(4)]
	zoneName := func(z int) string { return fmt.Sprintf("zone-%d", z) }
	for n := range nodes {
		inv.nodes = append(inv.nodes, testNode(fmt.Sprintf("node-%02d", n), zoneName(n%zones)))
	}
	addPool := func(pool string, devices []resourceapi.Device, perSlice int, spec func(*resourceapi.ResourceSliceSpec), missing int) {
		count := (len(devices) + perSlice - 1) / perSlice
		for i := range count {
			if i < missing {
				continue
			}
			end := min(len(devices), (i+1)*perSlice)
			slice := &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", pool, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:  gpuDriver,
					Pool:    resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: int64(count)},
					Devices: devices[i*perSlice : end],
				},
			}
			spec(&slice.Spec)
			inv.slices = append(inv.slices, slice)
		}
	}
	for z := range zones {
		for _, model := range inv.models {
			pool := fmt.Sprintf("%s/%s", zoneName(z), model)
			var devices []resourceapi.Device
			for d := range 1 + rng.IntN(12) {
				devices = append(devices, gpu(fmt.Sprintf("gpu-%d", d), model, zoneName(z), d))
				if rng.IntN(4) == 0 {
					inv.allocated.Insert(MakeDeviceID(gpuDriver, pool, fmt.Sprintf("gpu-%d", d)))
				}
			}
			selector := zoneSelector(zoneName(z))
			addPool(pool, devices, 1+rng.IntN(5), func(s *resourceapi.ResourceSliceSpec) { s.NodeSelector = selector }, 0)
		}
	}
	for _, node := range inv.nodes {
		if rng.IntN(3) != 0 {
			continue
		}
		model := inv.models[rng.IntN(len(inv.models))]
		zone := node.Labels[zoneLabel]
		devices := []resourceapi.Device{gpu("local-0", model, zone, 0), gpu("local-1", model, zone, 1)}
		addPool(node.Name+"/"+model, devices, 2, func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To(node.Name) }, 0)
	}
	// One pool of the first model in zone 0 that misses its first slice.
	addPool("incomplete", []resourceapi.Device{gpu("i-0", inv.models[0], zoneName(0), 0), gpu("i-1", inv.models[0], zoneName(0), 1)},
		1, func(s *resourceapi.ResourceSliceSpec) { s.NodeSelector = zoneSelector(zoneName(0)) }, 1)
	// Per-device node selection: each device for one node or one zone.
	var perDevice []resourceapi.Device
	for d := range 3 + rng.IntN(6) {
		model := inv.models[rng.IntN(len(inv.models))]
		device := gpu(fmt.Sprintf("pd-%d", d), model, "", d)
		if d%2 == 0 {
			device.NodeName = ptr.To(inv.nodes[rng.IntN(len(inv.nodes))].Name)
		} else {
			device.NodeSelector = zoneSelector(zoneName(rng.IntN(zones)))
		}
		perDevice = append(perDevice, device)
	}
	addPool("per-device", perDevice, len(perDevice), func(s *resourceapi.ResourceSliceSpec) { s.PerDeviceNodeSelection = ptr.To(true) }, 0)
	// Another driver's devices for all nodes, with attributes of its own.
	inv.slices = append(inv.slices, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   otherDriver,
			Pool:     resourceapi.ResourcePool{Name: "other", Generation: 1, ResourceSliceCount: 1},
			AllNodes: ptr.To(true),
			Devices: []resourceapi.Device{{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				resourceapi.QualifiedName(otherDriver + "/speed"): {IntValue: ptr.To(int64(100))},
			}}},
		},
	})
	rng.Shuffle(len(inv.slices), func(i, j int) { inv.slices[i], inv.slices[j] = inv.slices[j], inv.slices[i] })
	for i, model := range inv.models {
		inv.classes = append(inv.classes, modelClass(model, i%2 == 1))
	}
	inv.classes = append(inv.classes, celClass("other", fmt.Sprintf("device.driver == %q", otherDriver)))
	return inv
}

// claims makes a pod's claims: one to three, each with one or two requests of one
// to three devices of a random class, some with a claim selector of their own.
func (inv inventory) claims(rng *rand.Rand) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for c := range 1 + rng.IntN(3) {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", c), Namespace: "default", UID: "uid"}}
		for r := range 1 + rng.IntN(2) {
			class := inv.classes[rng.IntN(len(inv.classes))]
			request := resourceapi.DeviceRequest{Name: fmt.Sprintf("req-%d", r), Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: class.Name,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(1 + rng.IntN(3)),
			}}
			if class.Name != "other" && rng.IntN(3) == 0 {
				request.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf("device.attributes[%q].index %% 2 == 0", gpuDriver),
				}}}
			}
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, request)
		}
		out = append(out, claim)
	}
	return out
}

type outcome struct {
	Results []resourceapi.AllocationResult
	Err     string
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func allocatedState(inv inventory) AllocatedState {
	return AllocatedState{AllocatedDevices: inv.allocated, AllocatedSharedDeviceIDs: sets.New[SharedDeviceID](), AggregatedCapacity: internal.NewConsumedCapacityCollection()}
}

// both builds the patched and the unpatched allocator for one scheduling cycle.
func both(t *testing.T, inv inventory, lister DeviceClassLister) (*Allocator, *unpatched.Allocator) {
	t.Helper()
	ctx := context.Background()
	patched, err := NewAllocator(ctx, SupportedFeatures, allocatedState(inv), lister, inv.slices, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := unpatched.NewAllocator(ctx, SupportedFeatures, allocatedState(inv), lister, inv.slices, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatal(err)
	}
	return patched, plain
}

// TestSameResultsAsUnpatched: on generated inventories, for every pod and every node,
// one patched Allocator per pod called for all nodes (in parallel, as the scheduler
// does) returns exactly what the unpatched allocator returns, errors included.
func TestSameResultsAsUnpatched(t *testing.T) {
	ctx := context.Background()
	allocations := 0
	for seed := range uint64(60) {
		inv := generate(seed)
		lister := newClasses(inv.classes...)
		rng := rand.New(rand.NewPCG(seed, 11))
		for pod := range 4 {
			claims := inv.claims(rng)
			patched, plain := both(t, inv, lister)
			got := make([]outcome, len(inv.nodes))
			var wg sync.WaitGroup
			for i, node := range inv.nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results, err := patched.Allocate(ctx, node, claims)
					got[i] = outcome{results, errString(err)}
				}()
			}
			wg.Wait()
			for i, node := range inv.nodes {
				results, err := plain.Allocate(ctx, node, claims)
				want := outcome{results, errString(err)}
				if diff := cmp.Diff(want, got[i]); diff != "" {
					t.Fatalf("seed %d pod %d node %s: patched differs from unpatched (-unpatched +patched):\n%s", seed, pod, node.Name, diff)
				}
				if len(results) > 0 {
					allocations++
				}
			}
		}
	}
	// The generator must exercise the allocator, not only its failures.
	if allocations < 200 {
		t.Fatalf("only %d successful allocations compared; the generated inventories are too poor", allocations)
	}
}

// TestSelectorErrorsAsUnpatched: a class selector that fails at run time on some
// devices (an attribute only some devices have) fails the same way, on the same
// nodes, as without the patch.
func TestSelectorErrorsAsUnpatched(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(20) {
		inv := generate(seed)
		// Devices of the first model's zone-0 pool get an extra attribute; the class
		// tests it without has(), a runtime error on every other device it reaches.
		for _, slice := range inv.slices {
			if slice.Spec.Pool.Name == "zone-0/"+inv.models[0] {
				for i := range slice.Spec.Devices {
					slice.Spec.Devices[i].Attributes["healthy"] = resourceapi.DeviceAttribute{BoolValue: ptr.To(i%2 == 0)}
				}
			}
		}
		broken := celClass("broken", fmt.Sprintf("device.driver == %q && device.attributes[%q].healthy", gpuDriver, gpuDriver))
		inv.classes = append(inv.classes, broken)
		lister := newClasses(inv.classes...)
		claims := []*resourceapi.ResourceClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "uid"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "req", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "broken", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}}},
		}}
		patched, plain := both(t, inv, lister)
		errors := 0
		for _, node := range inv.nodes {
			results, err := patched.Allocate(ctx, node, claims)
			got := outcome{results, errString(err)}
			results, err = plain.Allocate(ctx, node, claims)
			want := outcome{results, errString(err)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("seed %d node %s (-unpatched +patched):\n%s", seed, node.Name, diff)
			}
			if err != nil {
				errors++
			}
		}
		if errors == 0 {
			t.Fatalf("seed %d: the broken selector never failed; the test does not test errors", seed)
		}
	}
}

// cachedSlices lists the slices that have class verdicts in an Allocator's cache.
func cachedSlices(a *Allocator) map[string]*sliceClassMatches {
	out := map[string]*sliceClassMatches{}
	a.nodeIndependent.classMatches.Range(func(key, value any) bool {
		k := key.(sliceClassKey)
		out[k.class.Name+"@"+k.slice.Name] = value.(*sliceClassMatches)
		return true
	})
	return out
}

func claimFor(class string, count int64) []*resourceapi.ResourceClaim {
	return []*resourceapi.ResourceClaim{{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "uid"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "req", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}}
}

// twoModelZone: one zone, two nodes, one pool per model with two slices of two devices.
func twoModelZone() inventory {
	inv := inventory{allocated: sets.New[DeviceID](), models: []string{"a100", "h100"}}
	inv.nodes = []*v1.Node{testNode("node-0", "zone-0"), testNode("node-1", "zone-0")}
	for _, model := range inv.models {
		for s := range 2 {
			inv.slices = append(inv.slices, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("zone-0-%s-%d", model, s)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:       gpuDriver,
					Pool:         resourceapi.ResourcePool{Name: "zone-0/" + model, Generation: 1, ResourceSliceCount: 2},
					NodeSelector: zoneSelector("zone-0"),
					Devices:      []resourceapi.Device{gpu(fmt.Sprintf("gpu-%d", 2*s), model, "zone-0", 2*s), gpu(fmt.Sprintf("gpu-%d", 2*s+1), model, "zone-0", 2*s+1)},
				},
			})
		}
	}
	return inv
}

// allocatedPools allocates claims on a node and names the devices allocated.
func allocatedPools(t *testing.T, a internal.Allocator, node *v1.Node, claims []*resourceapi.ResourceClaim) []string {
	t.Helper()
	results, err := a.Allocate(context.Background(), node, claims)
	if err != nil {
		t.Fatal(err)
	}
	var pools []string
	for _, result := range results {
		for _, device := range result.Devices.Results {
			pools = append(pools, device.Pool+"/"+device.Device)
		}
	}
	return pools
}

// TestVerdictsLiveForOneCycle: the verdicts computed for one node are reused for the
// next node by the same Allocator (one scheduling cycle), a new Allocator (the next
// cycle) starts empty, and a DeviceClass or slice that changed between cycles is
// judged afresh: no verdict outlives its cycle or its objects.
func TestVerdictsLiveForOneCycle(t *testing.T) {
	inv := twoModelZone()
	lister := newClasses(modelClass("a100", false))
	patched, _ := both(t, inv, lister)
	pools := allocatedPools(t, patched, inv.nodes[0], claimFor("gpu-a100", 1))
	if diff := cmp.Diff([]string{"zone-0/a100/gpu-0"}, pools); diff != "" {
		t.Fatalf("first cycle: %s", diff)
	}
	first := cachedSlices(patched)
	if len(first) == 0 {
		t.Fatal("no class verdicts cached after the first node")
	}
	// Pools are walked in name order: the a100 pool's first slice has a free match.
	if entry := first["gpu-a100@zone-0-a100-0"]; entry == nil || !entry.any || entry.evaluated != 2 {
		t.Fatalf("verdicts for the matching slice: %+v", entry)
	}
	_ = allocatedPools(t, patched, inv.nodes[1], claimFor("gpu-a100", 1))
	for key, entry := range cachedSlices(patched) {
		if first[key] != entry {
			t.Fatalf("the second node of the same cycle computed %s again", key)
		}
	}

	// Next cycle: the class now selects the other model (a new object, as an update
	// from the informer is), and the allocator sees it at once.
	lister.byName["gpu-a100"] = &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a100"}, Spec: modelClass("h100", false).Spec}
	next, _ := both(t, inv, lister)
	if n := len(cachedSlices(next)); n != 0 {
		t.Fatalf("a new Allocator starts with %d cached verdicts", n)
	}
	pools = allocatedPools(t, next, inv.nodes[0], claimFor("gpu-a100", 1))
	if diff := cmp.Diff([]string{"zone-0/h100/gpu-0"}, pools); diff != "" {
		t.Fatalf("after the class update: %s", diff)
	}

	// Within a cycle, a class object the lister returns anew is judged anew too.
	lister.set(modelClass("a100", false))
	pools = allocatedPools(t, next, inv.nodes[1], claimFor("gpu-a100", 1))
	if diff := cmp.Diff([]string{"zone-0/a100/gpu-0"}, pools); diff != "" {
		t.Fatalf("after a new class object within the cycle: %s", diff)
	}

	// Next cycle with changed slices: the a100 devices of the first slice are now
	// h100 (a new slice object with the same name); the class for a100 skips them.
	changed := twoModelZone()
	changed.slices[0] = changed.slices[0].DeepCopy()
	for i := range changed.slices[0].Spec.Devices {
		changed.slices[0].Spec.Devices[i].Attributes["gpu_type"] = resourceapi.DeviceAttribute{StringValue: ptr.To("h100")}
	}
	third, plain := both(t, changed, lister)
	pools = allocatedPools(t, third, inv.nodes[0], claimFor("gpu-a100", 1))
	if diff := cmp.Diff([]string{"zone-0/a100/gpu-2"}, pools); diff != "" {
		t.Fatalf("after the slice update: %s", diff)
	}
	want := allocatedPools(t, plain, inv.nodes[0], claimFor("gpu-a100", 1))
	if diff := cmp.Diff(want, pools); diff != "" {
		t.Fatalf("patched and unpatched differ after the slice update: %s", diff)
	}
	if entry := cachedSlices(third)["gpu-a100@zone-0-a100-0"]; entry == nil || entry.any {
		t.Fatalf("the changed slice should be cached with no match: %+v", entry)
	}
}

// TestSlicesSharingANameKeptApart: the verdicts of two slices with the same name (of
// different drivers, as callers other than the scheduler may pass) are not mixed up.
func TestSlicesSharingANameKeptApart(t *testing.T) {
	ctx := context.Background()
	inv := inventory{allocated: sets.New[DeviceID]()}
	inv.nodes = []*v1.Node{testNode("node-0", "zone-0")}
	for _, driver := range []string{gpuDriver, otherDriver} {
		inv.slices = append(inv.slices, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "same-name"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: driver, Pool: resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1},
				NodeName: ptr.To("node-0"), Devices: []resourceapi.Device{{Name: "dev"}},
			},
		})
	}
	lister := newClasses(celClass("gpu", fmt.Sprintf("device.driver == %q", gpuDriver)), celClass("other", fmt.Sprintf("device.driver == %q", otherDriver)))
	patched, plain := both(t, inv, lister)
	claims := []*resourceapi.ResourceClaim{claimFor("gpu", 1)[0], claimFor("other", 1)[0]}
	claims[1] = claims[1].DeepCopy()
	claims[1].Name = "claim-other"
	results, err := patched.Allocate(ctx, inv.nodes[0], claims)
	got := outcome{results, errString(err)}
	results, err = plain.Allocate(ctx, inv.nodes[0], claims)
	want := outcome{results, errString(err)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-unpatched +patched):\n%s", diff)
	}
	if len(got.Results) != 2 {
		t.Fatalf("expected both claims allocated, got %+v", got)
	}
}

// TestPerDeviceNodeSelectionNotCached: a slice with per-device node selection gets no
// cached verdicts (its devices are judged per node, for the devices the node sees),
// while the zone pools next to it do; allocations are those of the unpatched allocator.
func TestPerDeviceNodeSelectionNotCached(t *testing.T) {
	ctx := context.Background()
	inv := twoModelZone()
	inv.nodes = append(inv.nodes, testNode("node-2", "zone-1"))
	inv.slices = append(inv.slices, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "a-per-device"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:                 gpuDriver,
			Pool:                   resourceapi.ResourcePool{Name: "a-per-device", Generation: 1, ResourceSliceCount: 1},
			PerDeviceNodeSelection: ptr.To(true),
			Devices: func() []resourceapi.Device {
				own := gpu("pd-0", "a100", "", 0)
				own.NodeName = ptr.To("node-1")
				zoneOne := gpu("pd-1", "a100", "", 1)
				zoneOne.NodeSelector = zoneSelector("zone-1")
				return []resourceapi.Device{own, zoneOne}
			}(),
		},
	})
	lister := newClasses(modelClass("a100", false), modelClass("h100", true))
	patched, plain := both(t, inv, lister)
	for _, class := range []string{"gpu-a100", "gpu-h100"} {
		for _, node := range inv.nodes {
			results, err := patched.Allocate(ctx, node, claimFor(class, 1))
			got := outcome{results, errString(err)}
			results, err = plain.Allocate(ctx, node, claimFor(class, 1))
			want := outcome{results, errString(err)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s on %s (-unpatched +patched):\n%s", class, node.Name, diff)
			}
		}
	}
	// The per-device pool sorts first, so every a100 allocation walked it.
	pools := allocatedPools(t, patched, inv.nodes[1], claimFor("gpu-a100", 1))
	if diff := cmp.Diff([]string{"a-per-device/pd-0"}, pools); diff != "" {
		t.Fatalf("node-1 should get its own per-device GPU: %s", diff)
	}
	pools = allocatedPools(t, patched, inv.nodes[2], claimFor("gpu-a100", 1))
	if diff := cmp.Diff([]string{"a-per-device/pd-1"}, pools); diff != "" {
		t.Fatalf("node-2 should get zone-1's per-device GPU: %s", diff)
	}
	cached := cachedSlices(patched)
	for key := range cached {
		if key == "gpu-a100@a-per-device" || key == "gpu-h100@a-per-device" {
			t.Fatalf("verdicts cached for the per-device slice: %s", key)
		}
	}
	if cached["gpu-a100@zone-0-a100-0"] == nil {
		t.Fatalf("zone pool verdicts not cached: %v", cached)
	}
	// The h100 request skipped the a100 slices as a whole: cached, no match.
	if entry := cached["gpu-h100@zone-0-a100-0"]; entry == nil || entry.any {
		t.Fatalf("foreign slice verdicts for h100: %+v", entry)
	}
}
