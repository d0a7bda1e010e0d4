//! The provider conformance suite (`tests/conformance/`) against the Kubernetes provider on
//! the real test node(s): a kube-apiserver with kube-scheduler, kube-controller-manager and
//! kubelets running containerd (`tests/setup/node.sh`). Every Pod is placed by the real
//! scheduler and run by a real kubelet; exec goes through the API server to the kubelet.

mod harness;
#[macro_use]
mod conformance;

conformance_suite!(conformance::kubernetes::fixture);
