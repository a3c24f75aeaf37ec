// The deployment recipes in deploy/ checked offline (deploy/check_recipes.py): the Kubernetes
// manifests, the Dockerfile, the Slurm script and the systemd units, with the specs they carry
// parsed by the real daemons (psctl spec, then each role's daemon parsing its flags).
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "deploy/local_cluster.h"
#include "tests/run_dir.h"

namespace ps {
namespace {

// Runs the check `what`; skips the test when a tool it needs is missing (exit 77).
void Check(const std::string& what) {
  const CommandResult r =
      RunCommand(std::string(PS_PYTHON) + " " + PS_SOURCE_DIR + "/deploy/check_recipes.py " + what +
                 " --bin=" + ExecutableDir());
  std::cout << r.output;
  if (r.exit_code == 77) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(DeployRecipesTest, KubernetesManifestsAgreeWithTheirClusterSpec) { Check("k8s"); }
TEST(DeployRecipesTest, TheDockerfileBuildsOnDebianAndRunsOnCuda) { Check("docker"); }
TEST(DeployRecipesTest, TheSlurmScriptWritesASpecTheDaemonsAccept) { Check("slurm"); }
TEST(DeployRecipesTest, TheSystemdUnitsVerify) { Check("systemd"); }

}  // namespace
}  // namespace ps
