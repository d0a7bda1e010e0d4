// The test node's pod sandbox ("pause") program; no dependencies.
// Built and packed into an image by tests/setup/node.sh.
module sandbox-operator.test/tools/pause

go 1.26.0
