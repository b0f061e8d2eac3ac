#include <cstdlib>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh {

TEST(Env, UnsetUsesFallback) {
  unsetenv("NDMESH_TIMEOUT_S");
  EXPECT_DOUBLE_EQ(env::seconds("NDMESH_TIMEOUT_S", 30.0), 30.0);
}

TEST(Env, ParsesSeconds) {
  setenv("NDMESH_TIMEOUT_S", "2.5", 1);
  EXPECT_DOUBLE_EQ(env::seconds("NDMESH_TIMEOUT_S", 30.0), 2.5);
  unsetenv("NDMESH_TIMEOUT_S");
}

TEST(Env, MalformedValueNamesVariableAndValue) {
  setenv("NDMESH_TIMEOUT_S", "soon", 1);
  try {
    env::seconds("NDMESH_TIMEOUT_S", 30.0);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("NDMESH_TIMEOUT_S"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'soon'"), std::string::npos) << msg;
  }
  unsetenv("NDMESH_TIMEOUT_S");
}

TEST(Env, IntegerRange) {
  setenv("NDMESH_THREADS", "0", 1);
  EXPECT_THROW(env::integer("NDMESH_THREADS", 1, 1, 1024), ConfigError);
  setenv("NDMESH_THREADS", "4", 1);
  EXPECT_EQ(env::integer("NDMESH_THREADS", 1, 1, 1024), 4);
  unsetenv("NDMESH_THREADS");
}

TEST(Env, UndeclaredVariableIsAProgrammingError) {
  EXPECT_THROW(env::raw("NDMESH_NOT_A_THING"), InternalError);
}

// check_all refuses a bad value of any variable, even one the command never reads.
TEST(Env, CheckAllRefusesEveryMalformedVariable) {
  EXPECT_NO_THROW(env::check_all());
  const std::pair<const char*, const char*> bad[] = {
      {"NDMESH_LOG", "verbose"},      {"NDMESH_TIMEOUT_S", "5m"},   {"NDMESH_THREADS", "many"},
      {"NDMESH_BACKEND", "ucc"},      {"NDMESH_ATTENTION", "fast"}, {"NDMESH_EPILOGUES", "none"},
      {"NDMESH_DETERMINISTIC", "yes"}};
  for (auto [name, value] : bad) {
    setenv(name, value, 1);
    try {
      env::check_all();
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(value), std::string::npos) << e.what();
    }
    unsetenv(name);
  }
  setenv("NDMESH_LOG", "debug", 1);
  setenv("NDMESH_EPILOGUES", "off", 1);
  setenv("NDMESH_DETERMINISTIC", "0", 1);
  EXPECT_NO_THROW(env::check_all());
  unsetenv("NDMESH_LOG");
  unsetenv("NDMESH_EPILOGUES");
  unsetenv("NDMESH_DETERMINISTIC");
}

}  // namespace ndmesh
