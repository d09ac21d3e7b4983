# dscluster — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DSC := $(BIN)/dscluster
INV ?= local
# The cluster tag for INV=aws (instances tagged dscluster:cluster=$(CLUSTER)); extra flags
# for the inventory commands, e.g. AWS_ARGS='--region us-west-2 --profile prod'.
CLUSTER ?= dscluster
# `make test` runs unit and molecule with this prefix, so the end-to-end track (the longest)
# gets the CPU first.
NICE ?=
AWS_ARGS ?=
SLURM_ARGS ?=
NODES ?= 3
ZERO ?= 2
# The demo's node OS: empty for Debian 12 (bookworm), trixie for Debian 13.
NODE_OS ?=
NODE_BASE = $(if $(NODE_OS),--base debian:$(NODE_OS))
export DSCLUSTER_HOME := $(CURDIR)
export DSCLUSTER_CACHE ?= $(HOME)/.cache/dscluster
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

# Python that roles ship to nodes (detectors, recorders), and make cuda-wheel's check (it runs
# in the build container): linted like python/.
ROLE_PY = $(wildcard roles/*/files/*.py roles/*/files/*.fact examples/*/*.py plugins/*/*.py) scripts/wheel_ops.py scripts/bench_stream.py

# Where named inventories live (inventories/<name>/hosts.yml).
INVENTORIES ?= inventories
# An inventory name (local, aws, slurm, or a directory under $(INVENTORIES)/) or a path.
INV_PATH = $(if $(wildcard $(INV)/hosts.yml)$(wildcard $(INV)),$(INV),$(INVENTORIES)/$(INV))

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[1m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# uv (pinned in the lock) installs the lock, much faster than pip, which stays in the venv for
# users. --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set nothing is
# compiled later, and every ansible-playbook and dscluster process would compile its imports.
$(BIN)/dscluster: python/pyproject.toml python/requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	awk '/^uv==/ {p = 1} p {print} p && !/\\$$/ {exit}' python/requirements-dev.lock >$(VENV)/uv.lock.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r $(VENV)/uv.lock.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode --require-hashes -r python/requirements-dev.lock
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e python
	@touch $@

.PHONY: venv
venv: $(BIN)/dscluster ## Create .venv with dscluster, Ansible, molecule and the linters

.PHONY: engine
engine: ## Start a Docker engine when none answers (installs docker.io if needed)
	@bash docker/ensure-engine.sh

.PHONY: images
images: venv engine ## Base image (pull, else debootstrap) and node image, cached by Docker
	@$(DSC) image $(NODE_BASE)

.PHONY: demo
demo: images ## Local 3-node cluster, provisioned, hostfile, smoke test (ZeRO-2); NODE_OS=trixie for Debian 13
	$(DSC) local up --name local --nodes $(NODES) $(NODE_BASE)
	$(DSC) provision -i inventories/local
	$(DSC) hostfile -i inventories/local
	$(DSC) smoke -i inventories/local --zero $(ZERO)

.PHONY: provision
provision: venv ## Inventory -> site.yml -> hostfile -> smoke; INV=local|aws|slurm|<name>|<path>
	@case "$(INV)" in \
	  local) $(MAKE) --no-print-directory images && \
	         $(DSC) local up --name local --nodes $(NODES) ;; \
	  aws)   $(DSC) inventory aws --cluster $(CLUSTER) --out $(INVENTORIES)/aws $(AWS_ARGS) ;; \
	  slurm) $(DSC) inventory slurm --name slurm --out $(INVENTORIES)/slurm $(SLURM_ARGS) ;; \
	esac
	$(DSC) provision -i $(INV_PATH)
	$(DSC) hostfile -i $(INV_PATH)
	$(DSC) smoke -i $(INV_PATH) --zero $(ZERO)

.PHONY: doctor
doctor: venv ## Check every node and pair of nodes (SSH, ports, versions, shm, memlock...); INV=local|<name>|<path>
	$(DSC) doctor -i $(INV_PATH)

.PHONY: down
down: venv ## Remove the local cluster (containers, network, volume, inventory, keys)
	$(DSC) local down --name local

.PHONY: lint
lint: venv ## ruff, mypy, yamllint, ansible-lint (production), argument_specs vs defaults
	$(BIN)/ruff check python
	$(BIN)/ruff format --check python
	cd python && ../$(BIN)/mypy
	$(BIN)/ruff check --config python/pyproject.toml $(ROLE_PY)
	$(BIN)/ruff format --config python/pyproject.toml --check $(ROLE_PY)
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint
	$(BIN)/python scripts/check_argument_specs.py

.PHONY: docs
docs: venv ## Regenerate docs/roles/, the roles reference, from meta/argument_specs.yml (ansible-doc)
	$(BIN)/python scripts/roles_doc.py

.PHONY: unit
unit: venv ## Python unit tests (no Docker)
	$(NICE) bash scripts/pytest.sh -m "not docker" --durations=15

.PHONY: e2e
e2e: images ## End-to-end test: local cluster, provision, hostfile, smoke, DeepSpeed parsers
	bash scripts/pytest.sh -m "docker and not installed" --durations=25

# make test splits `e2e` in three: the modules on the shared e2e cluster (the critical path),
# and, in the molecule lane, those on a second cluster and those with containers of their own.
# The shared cluster starts from the image the second cluster's bake module kept in an earlier
# run of the same inputs (roles, playbooks, package, node image, wheelhouse), where there is
# one: its provision is then a verify pass (python/tests/e2e/e2e_cluster.py, cached_image).
# DSCLUSTER_TEST_CPU (here, e2e-second and installed): each session ends with its tests' CPU,
# the controller's and its clusters' nodes' (python/tests/e2e/cpu_profile.py): the lanes share
# two cores, so their wall times mislead.
.PHONY: e2e-cluster
e2e-cluster: images
	DSCLUSTER_E2E_IMAGE_CACHE=1 DSCLUSTER_TEST_CPU=$${DSCLUSTER_E2E_NAME:-e2e} bash scripts/pytest.sh -m "docker and not installed and not own_containers and not second_cluster" --durations=25
	@$(lane_end)

# The modules marked second_cluster (bake, grow and replace, the job and user-site attacks:
# about 13 of e2e's 45 minutes) on a cluster of their own, provisioned in that session:
# DSCLUSTER_E2E_NAME plus "b" (e2eb). The attacks sit here to shorten the critical lane.
# Not niced: beside e2e-cluster's tail it is the other long path.
.PHONY: e2e-second
e2e-second: images
	name=$${DSCLUSTER_E2E_NAME:-e2e}b; \
	  DSCLUSTER_E2E_NAME=$$name DSCLUSTER_TEST_CPU=$$name bash scripts/pytest.sh -m "docker and second_cluster and not installed" --durations=10

.PHONY: e2e-own
e2e-own: images
	$(NICE) bash scripts/pytest.sh -m "docker and own_containers and not installed" --durations=10

.PHONY: installed
installed: images ## The wheel and collection installed away from the clone: static, local up, provision, smoke, FQCN roles
	DSCLUSTER_TEST_CPU=$${DSCLUSTER_INSTALLED_NAME:-pipcl} $(NICE) bash scripts/pytest.sh -m installed --durations=10

.PHONY: dist
dist: venv ## Build the sdist, the wheel from it (both carry the collection) and the collection tarball into dist/
	rm -rf dist && mkdir -p dist
	$(BIN)/python -m build --outdir dist python   # the sdist, then the wheel built from it
	$(BIN)/ansible-galaxy collection build --force --output-path dist .
	@ls -1 dist

.PHONY: molecule
molecule: images ## The project and role molecule scenarios, two at a time (each one's output printed when it ends)
	@$(MAKE) --no-print-directory -j2 --output-sync=target molecule-cluster molecule-accelerators molecule-storage molecule-roles

# The collection's scenarios are extensions/molecule/<name> (on extensions/molecule/config.yml),
# run from the root; a role that runs alone has the scenario named after it.
MOLECULE_SCENARIOS := $(patsubst extensions/molecule/%/molecule.yml,%,$(wildcard extensions/molecule/*/molecule.yml))
MOLECULE_ROLES := $(filter $(patsubst _%,%,$(patsubst roles/%/,%,$(wildcard roles/*/))),$(MOLECULE_SCENARIOS))

.PHONY: molecule-roles
molecule-roles: images ## Role scenarios, one after the other (extensions/molecule/<role>: apt_repo, doctor, slurm)
	@for role in $(MOLECULE_ROLES); do $(MAKE) --no-print-directory molecule-role-$$role || exit 1; done

molecule-role-%: images
	DSCLUSTER_NODE_IMAGE=$$($(DSC) image) $(NICE) $(BIN)/molecule test -s $*; \
	  rc=$$?; docker volume rm -f dsc-$*-shared >/dev/null 2>&1; exit $$rc

.PHONY: molecule-cluster
molecule-cluster: images ## molecule test -s cluster (head + 1 worker, converge = site.yml)
	@docker volume rm -f dsc-mol-shared >/dev/null 2>&1 || true  # a volume left by an earlier run
	DSCLUSTER_NODE_IMAGE=$$($(DSC) image) $(NICE) $(BIN)/molecule test -s cluster; \
	  rc=$$?; docker volume rm -f dsc-mol-shared >/dev/null 2>&1; exit $$rc

.PHONY: molecule-accelerators
molecule-accelerators: images ## molecule test -s accelerators (NVIDIA/CUDA/Gaudi/EFA/NCCL roles vs stand-in vendor repos)
	DSCLUSTER_NODE_IMAGE=$$($(DSC) image) \
	DSCLUSTER_STANDIN_IMAGE=$$(bash extensions/molecule/accelerators/standin/image.sh) \
	  $(NICE) $(BIN)/molecule test -s accelerators

.PHONY: molecule-trixie
molecule-trixie: venv engine ## molecule test -s trixie: the cluster scenario on Debian 13 nodes (not in make test)
	@docker volume rm -f dsc-molt-shared >/dev/null 2>&1 || true
	DSCLUSTER_NODE_IMAGE=$$($(DSC) image --base debian:trixie) $(NICE) $(BIN)/molecule test -s trixie; \
	  rc=$$?; docker volume rm -f dsc-molt-shared >/dev/null 2>&1; exit $$rc

.PHONY: molecule-storage
molecule-storage: images ## molecule test -s storage (NFS server on the head, NFS clients; exports, fstab, mount units)
	DSCLUSTER_NODE_IMAGE=$$($(DSC) image) $(NICE) $(BIN)/molecule test -s storage

.PHONY: dsconfig
dsconfig: venv ## DeepSpeed config checked on the cluster; INV=local ZERO=3 OFFLOAD=cpu|nvme|none
	$(DSC) dsconfig -i $(INV_PATH) --zero $(ZERO) --offload $(or $(OFFLOAD),none)

.PHONY: training-image
training-image: venv engine ## Multi-node training image from a wheelhouse (VARIANT=cpu|cuda|gaudi WHEELHOUSE=dir)
	@test -n "$(WHEELHOUSE)" || { echo "set WHEELHOUSE=~/.cache/dscluster/wheelhouse/<key> (made by 'make provision')"; exit 1; }
	bash docker/training/build.sh $(or $(VARIANT),cpu) $(WHEELHOUSE)

.PHONY: test
test: images ## Everything: the wheelhouse, then lint and three lanes side by side (each one's output printed when it ends)
	@$(MAKE) --no-print-directory wheelhouse
	@$(BIN)/python scripts/bench_cpu.py calibrate; \
	  t0=$$(date +%s); cpu0=$$($(BIN)/python scripts/bench_cpu.py machine); \
	  $(MAKE) --no-print-directory -j4 --output-sync=target lint-lane unit-installed molecule-serial e2e-cluster NICE="nice -n 10" LANE_T0=$$t0; \
	  rc=$$?; $(BIN)/python scripts/bench_cpu.py since "$$cpu0" "$$t0"; $(BIN)/python scripts/bench_cpu.py calibrate; exit $$rc

# Lint beside the lanes, niced: before them it would hold one core while the other idles.
# A failure still fails make test, when the lanes have ended.
.PHONY: lint-lane
lint-lane: venv
	@$(NICE) $(MAKE) --no-print-directory lint
	@$(lane_end)

# Each lane of make test says when it ended (seconds after the lanes started): the log then
# shows the critical path. Nothing when a lane's target runs alone.
lane_end = if [ -n "$(LANE_T0)" ]; then echo "== lane $@ ended $$(date -u +%T), $$(( $$(date +%s) - $(LANE_T0) )) s after the lanes started"; fi

# Before the lanes, alone: on a cold machine the DeepSpeed build gets both cores instead of
# three lanes waiting on its lock; with a wheelhouse cached for the pins it does nothing.
.PHONY: wheelhouse
wheelhouse: images ## The controller's wheelhouse (torch + DeepSpeed with its ops) on a 1-node cluster, unless cached
	bash scripts/wheelhouse.sh

# Lane 1: the unit tests, the installed-package test (a venv, a 2-node cluster), the role
# scenarios, then e2e-own. Lane 2 (molecule-serial): accelerators and storage, then
# e2e-second. Lane 3: e2e-cluster. e2e-own sits in lane 1 to even out the lanes' lengths.
.PHONY: unit-installed
unit-installed: images
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory installed
	@$(MAKE) --no-print-directory molecule-roles
	@$(MAKE) --no-print-directory e2e-own
	@$(lane_end)

# The scenarios one after the other (beside e2e, two converges at once slow e2e's own),
# then the e2e modules on a second cluster (those that bring their own containers are in
# lane 1). Not
# molecule-cluster: its converge and idempotence are e2e's own (test_provision, then site.yml
# from the root with changed=0) and its verify.yml runs on the e2e cluster
# (test_e2e_root_site); `make molecule` runs it whole.
.PHONY: molecule-serial
molecule-serial: images
	@$(MAKE) --no-print-directory molecule-accelerators molecule-storage
	@$(MAKE) --no-print-directory e2e-second
	@$(lane_end)

# The base-layer hash locks shipped in roles/ml_stack/files/locks that PyPI alone can make
# (variant:python), written by `dscluster lock` from the role's pins; review the diff. The
# cpu cp311 and pypi cp313 locks predate the command (their content is part of today's
# wheelhouse keys): `dscluster lock --variant cpu --python 3.11` remakes the first where
# download.pytorch.org is reachable.
LOCKS ?= pypi:3.10 pypi:3.11 pypi:3.12
.PHONY: locks
locks: venv ## Rewrite the shipped hash locks of torch + DeepSpeed (LOCKS="pypi:3.10 ...") from PyPI
	@for lk in $(LOCKS); do \
	  $(DSC) lock --variant $${lk%%:*} --python $${lk##*:} -o roles/ml_stack/files/locks || exit 1; \
	done

# DeepSpeed's CUDA ops compiled without a GPU: PyPI's hash-locked CUDA compiler wheels in a
# build venv, in a node container with no network (scripts/cuda_wheel.sh); not in make test.
.PHONY: cuda-wheel
cuda-wheel: venv engine ## DeepSpeed wheel with its CUDA ops pre-built in a node container, no GPU, then checked (cuobjdump)
	bash scripts/cuda_wheel.sh

.PHONY: bench
bench: images ## Timings: demo cold vs warm, re-converge, job start with/without pre-built ops
	bash scripts/bench.sh

.PHONY: clean
clean: ## Remove the venv and the local cluster (keeps cached images, the wheelhouse and the .deb volume)
	-$(DSC) local down --name local
	rm -rf $(VENV)
