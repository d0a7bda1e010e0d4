// kstatus reads one Kubernetes object as JSON on stdin (for example the output of
// `kubectl get sandbox NAME -o json`) and prints how sigs.k8s.io/cli-utils' kstatus library —
// the library Flux, kpt and `kubectl wait`-style tooling use — reads its health:
//
//	<Status>\t<message>
//
// where Status is one of InProgress, Failed, Current, Terminating, NotFound, Unknown.
// It exits 0 whenever kstatus computed a status, 1 when the input is not an object, 2 when
// kstatus itself failed.
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading stdin: %v\n", err)
		os.Exit(1)
	}
	// apimachinery's json decodes whole numbers as int64, as unstructured objects need
	// (encoding/json's float64 would make kstatus fail on metadata.generation).
	var obj map[string]interface{}
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		fmt.Fprintf(os.Stderr, "kstatus: stdin is not a JSON object: %v\n", err)
		os.Exit(1)
	}
	res, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
		os.Exit(2)
	}
	fmt.Printf("%s\t%s\n", res.Status, res.Message)
}
