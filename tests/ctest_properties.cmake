# CTest properties of the tests, in one table (included by CMakeLists.txt).
#
# Every test gets the label of its folder (unit, scenario, tools) and OMP_NUM_THREADS=1. A row
# below adds, for one test:
#   processes  the most processes it runs at once (its ranks, or the launcher's workers; the
#              test process itself waits meanwhile): CTest's PROCESSORS, so `ctest -j N` never
#              starts more than N busy processes, and a test wider than N runs alone;
#   timeout    seconds: about 3x its time in a `ctest -j2` run of the whole suite on the 2-core
#              reference VM, at least 120 (a loaded machine is slower);
#   labels     "slow" for tests over 60 s there (`ctest -LE slow` leaves them out).
# A test without a row: 1 process, MIXTRAIN_TEST_DEFAULT_TIMEOUT seconds, no extra label (every
# such test took under 20 s there). A row naming no test is a configure error.
set(MIXTRAIN_TEST_DEFAULT_TIMEOUT 120)
set(MIXTRAIN_TEST_TABLE
  # test                                     processes  timeout  labels
  "unit_distributed_config_agreement_test    3          120"
  "unit_distributed_device_mesh_test         4          120"
  "unit_distributed_distributed_muon_test    4          300"
  "unit_distributed_expert_parallel_test     4          600      slow"
  "unit_distributed_fsdp_test                4          900      slow"
  "unit_distributed_gloo_collectives_test    4          180"
  "unit_distributed_launcher_test            3          300"
  "unit_optim_adamw_test                     1          300"
  "scenarios_checkpoint_resharding_test       4          600      slow"
  "scenarios_rfc_case_2_2_test                2          300"
  "scenarios_rfc_case_2_3_test                1          120"
  "scenarios_rfc_case_2_4_test                1          300"
  "scenarios_one_step_oracle_test             1          120"
  # "scenarios_rfc_case_2_1_scale_test       8          ...      slow"   (8 ranks; added on merge)
  "tools_checkpoint_resume_test              2          600      slow"
  "tools_distributed_train_test              4          600      slow"
  "tools_interrupt_test                      1          180"
  "tools_optim_replay_command_test           1          300"
  "tools_optim_replay_distributed_test       4          300"
  "tools_swap_optimizer_test                 2          600      slow"
  "tools_train_command_test                  2          600      slow"
)

# Applies the table to the tests already added; call once, after the last add_test.
function(mixtrain_apply_test_properties tests)
  set(listed)
  foreach(row ${MIXTRAIN_TEST_TABLE})
    separate_arguments(fields UNIX_COMMAND "${row}")
    list(GET fields 0 name)
    list(GET fields 1 processes)
    list(GET fields 2 timeout)
    set(labels)
    list(LENGTH fields count)
    if(count GREATER 3)
      list(SUBLIST fields 3 -1 labels)
    endif()
    if(NOT name IN_LIST tests)
      message(FATAL_ERROR "tests/ctest_properties.cmake: no test named '${name}'")
    endif()
    list(APPEND listed ${name})
    get_test_property(${name} LABELS folder_label)
    set_tests_properties(${name} PROPERTIES
      PROCESSORS ${processes} TIMEOUT ${timeout} LABELS "${folder_label};${labels}")
  endforeach()
  foreach(name ${tests})
    if(NOT name IN_LIST listed)
      set_tests_properties(${name} PROPERTIES TIMEOUT ${MIXTRAIN_TEST_DEFAULT_TIMEOUT})
    endif()
  endforeach()
endfunction()
