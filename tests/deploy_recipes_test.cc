// The deployment recipes in deploy/ checked offline (deploy/check_recipes.py): the Kubernetes
// manifests, the Dockerfile, the Slurm script and the systemd units, with the specs they carry
// parsed by the real daemons (psctl spec, then each role's daemon parsing its flags).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "deploy/local_cluster.h"

namespace ps {
namespace {

// Runs the check `what`; skips the test when a tool it needs is missing (exit 77).
void Check(const std::string& what) {
  const std::string command = std::string("python3 ") + PS_SOURCE_DIR +
                              "/deploy/check_recipes.py " + what + " --bin=" + ExecutableDir() +
                              " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::cout << output;
  if (code == 77) GTEST_SKIP() << output;
  EXPECT_EQ(code, 0) << output;
}

TEST(DeployRecipesTest, KubernetesManifestsAgreeWithTheirClusterSpec) { Check("k8s"); }
TEST(DeployRecipesTest, TheDockerfileBuildsOnDebianAndRunsOnCuda) { Check("docker"); }
TEST(DeployRecipesTest, TheSlurmScriptWritesASpecTheDaemonsAccept) { Check("slurm"); }
TEST(DeployRecipesTest, TheSystemdUnitsVerify) { Check("systemd"); }

}  // namespace
}  // namespace ps
